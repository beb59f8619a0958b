"""vLLM's engine rules by release (``replica.core.vllm_versions``): the table's lookup, the settings a row
gives, and vLLM 0.2.3's scheduler on three requests worked by hand."""

import pytest

from bench.record_vllm_steps import VLLM_VERSION
from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool
from replica.core.sched.scheduler import SchedRequest, Scheduler, SchedulerSettings
from replica.core.vllm_versions import GIB, NEWEST, RULES, EngineSettings, parse_version, rules_for
from shared.costmodel import CostModel, get_gpu
from shared.errors import InputError

A100 = get_gpu("a100-80gb")
H200 = get_gpu("h200")
RTX_4090 = get_gpu("rtx-4090")


def test_rows_are_in_release_order_and_the_newest_is_what_kvemu_records_against():
    assert [r.since for r in RULES] == sorted({r.since for r in RULES})  # strictly increasing
    assert RULES[-1].since == NEWEST == parse_version(VLLM_VERSION)


@pytest.mark.parametrize("text, row", [
    ("0.1.0", (0, 1, 0)), ("0.2.1", (0, 1, 0)),  # before the budget's change: the first row
    ("0.2.2", (0, 2, 2)), ("0.2.3", (0, 2, 2)), ("v0.2.3", (0, 2, 2)),  # DistServe's baseline: between rows
    ("0.2.6", (0, 2, 6)), ("0.3.3", (0, 2, 6)), ("0.7.3", (0, 6, 0)), ("0.8.5", (0, 8, 0)),
    ("0.10.1", (0, 9, 0)), ("0.19.0", (0, 14, 0)), ("0.33.0", (0, 33, 0)),
])
def test_a_release_takes_the_row_at_or_below_it(text, row):
    assert rules_for(text).since == row


@pytest.mark.parametrize("text", ["0.2", "abc", "0.2.3.post1", "", " ", "0.2.x", "1..2", "0.2.3rc1"])
def test_a_malformed_release_is_one_line_naming_the_flag(text):
    with pytest.raises(InputError) as err:
        rules_for(text, "--vllm-version")
    assert err.value.field == "--vllm-version"
    assert str(err.value) == f"--vllm-version: expected a vLLM release as X.Y.Z (e.g. 0.2.3), got {text!r}"


def test_releases_outside_the_table_are_refused_naming_the_flag():
    with pytest.raises(InputError, match=r"^--vllm-version: kvemu follows vLLM up to 0\.33\.0; the rules of 0\.34\.0"
                                         r" are not known here: give 0\.33\.0 or an earlier release$"):
        rules_for("0.34.0", "--vllm-version")
    with pytest.raises(InputError, match=r"^--vllm-version: vLLM's first release is 0\.1\.0; got 0\.0\.9$"):
        rules_for("0.0.9", "--vllm-version")


def test_the_settings_each_era_gives():
    # 0.2.3: v0 steps without a prefix cache, the block manager's 1% watermark, max(max_model_len, 2048)
    # tokens a step (OPT-13B's window is 2048; a 4096-token window makes 4096), 256 sequences
    v023 = rules_for("0.2.3")
    assert v023.settings(2048, A100.memory_bytes, A100.name) == EngineSettings("v0", "off", 0.01, 2048, 256)
    assert v023.settings(4096, A100.memory_bytes, A100.name).token_budget == 4096
    assert rules_for("0.1.7").settings(4096, A100.memory_bytes, A100.name).token_budget == 2560  # a fixed default
    # v0 with prefix caching available but off by default (0.4 to 0.7)
    assert rules_for("0.5.0").settings(8192, H200.memory_bytes, H200.name) == EngineSettings("v0", "off", 0.01, 8192, 256)
    # V1: mixed steps, prefix caching on, no watermark; max_num_batched_tokens and max_num_seqs by the GPU
    newest = rules_for("0.33.0")
    assert newest.settings(8192, H200.memory_bytes, H200.name) == EngineSettings("v1", "on", 0.0, 8192, 1024)
    assert newest.settings(8192, A100.memory_bytes, A100.name) == EngineSettings("v1", "on", 0.0, 2048, 256)  # A100: small
    assert newest.settings(8192, RTX_4090.memory_bytes, RTX_4090.name).token_budget == 2048  # 24 GiB: small
    assert newest.settings(8192, 180 * GIB, "b200") == EngineSettings("v1", "on", 0.0, 16384, 1024)
    assert rules_for("0.8.0").settings(8192, H200.memory_bytes, H200.name).token_budget == 2048  # before the tiers


def test_what_a_row_does_not_model_is_named():
    assert rules_for("0.2.3").unmodelled()[:2] == ["no CUDA graphs (every step eager)",
                                                   "prompts padded to the longest of their step (max_paddings 256)"]
    assert "async scheduling" in rules_for("0.19.0").unmodelled()
    assert "CUDA-graph memory in the memory rule" in rules_for("0.33.0").unmodelled()


def test_vllm_0_2_3s_scheduler_on_three_requests():
    """The 0.2.3 row's settings on a 100-block pool (watermark: 1 block). A (800 tokens, 50 blocks) and B
    (640, 40) fit one step's 2,048 tokens and the pool; C (160, 10) fits the budget (1,600) and exactly the
    10 blocks left, but not with the watermark's block free: it waits. Step 1 prefills A and B; step 2
    decodes them (C still waits: prefills come first only when one fits), each writing one more block and
    finishing with its second token; step 3 prefills C alone; step 4 decodes C, its last."""
    s = rules_for("0.2.3").settings(2048, A100.memory_bytes, A100.name)
    cost = CostModel.from_names("opt-13b", "a100")
    pool = BlockPool(100, make_policy("lru"), block_size=16, emit_events=False, prefix_caching=False)
    sched = Scheduler(pool, cost, SchedulerSettings(token_budget=s.token_budget, max_running=s.max_running,
                                                    watermark=s.watermark, step_rule=s.step_rule))
    a, b, c = (SchedRequest(i, [100 * i + j for j in range(n // 16)], n, 2, 0.0) for i, n in ((1, 800), (2, 640), (3, 160)))
    for r in (a, b, c):
        sched.submit(r)
    now, steps = 0.0, []
    while sched.has_work():
        res = sched.step(now, now)
        steps.append((res.prefill_tokens, [r.rid for r in res.first_tokens], sorted(r.rid for r, _ in res.decoded),
                      sorted(r.rid for r in res.finished)))
        now += res.duration
    assert steps == [(1440, [1, 2], [], []), (0, [], [1, 2], [1, 2]), (160, [3], [], []), (0, [], [3], [3])]
    assert sched.preemptions == 0 and pool.capacity - pool.room == 0
