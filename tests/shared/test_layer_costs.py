"""The cost model's attention terms per kind of layer (shared/model_kinds.py, shared/costmodel.py), worked by hand:
a sliding-window layer reads each context up to its window, a state layer its fixed state once a step."""

import pytest

from replica.core.cache.grouped import GroupedPool
from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool
from replica.core.sched.scheduler import SchedRequest, Scheduler
from shared.costmodel import CostModel, StepWork
from shared.model_kinds import layer_counts, window_pairs

H200_BW = 4.8e12  # bytes/s (shared/gpu_presets.py)
H200_PEAK = 989e12  # FLOP/s


def test_window_pairs_cut_each_query_to_the_window():
    assert window_pairs(200, 0, 128) == sum(range(128)) + 72 * 128 == 17_344
    assert window_pairs(10, 120, 128) == sum(range(120, 128)) + 2 * 128 == 1_244
    assert window_pairs(5, 300, 128) == 5 * 128
    assert window_pairs(100, 0, 128) == 100 * 99 / 2  # every key inside the window: full attention's pairs
    work = StepWork.of([(200, 0), (10, 120), (5, 300)], window=128)
    assert (work.window_pairs, work.window_cached) == (17_344 + 1_244 + 640, 0 + 120 + 128)


def test_gpt_oss_120b_decode_at_8k_reads_the_full_group_whole_and_the_window_group_128_tokens():
    cost = CostModel.from_names("gpt-oss-120b", "h200")
    assert layer_counts(cost.model)[:3] == (18, 18, 128) and cost.window == 128
    token = 2 * 8 * 64 * 2  # one layer's K and V of a token: 8 KV heads of 64, BF16
    full, window = 18 * token * 8192, 18 * token * 128  # one sequence at 8,192 tokens
    assert (full, window) == (301_989_888, 4_718_592)  # every layer full attention: 603,979,776
    work = StepWork(decoders=1, decode_kv=8192, window_kv=128)
    parts = cost.step_parts(work)
    eff = cost.efficiency
    assert parts.decode_kv == pytest.approx((full + window) / (H200_BW * eff.decode_kv_eff), rel=1e-12)
    pair = 4 * 64 * 64  # QK and PV over 64 query heads of 64
    assert parts.decode_attention == pytest.approx(pair * 18 * (8192 + 128) / (H200_PEAK * eff.attention), rel=1e-12)
    # the window not given: bounded by decoders x window, exact here (the context is past the window)
    assert cost.step_time(StepWork(decoders=1, decode_kv=8192)) == cost.step_time(work)
    # a chunk of 1,000 after 4,000 cached: 4,000 x 1,000 + 1000 x 999 / 2 pairs full, 128 x 1,000 in the window
    chunk = cost.step_parts(StepWork.of([(1000, 4000)], window=128))
    assert chunk.attention == pytest.approx(pair * (18 * 4_499_500 + 18 * 128_000) / (H200_PEAK * eff.attention),
                                            rel=1e-12)


def test_qwen3_next_reads_and_writes_each_sequences_state_once_a_step():
    cost = CostModel.from_names("qwen3-next-80b-a3b", "h200@tp2")
    n = layer_counts(cost.model)
    assert (n.full, n.state, n.state_bytes, cost.window) == (12, 36, 36 * 1_097_728, 0)
    eff, bw = cost.efficiency, 2 * H200_BW  # two GPUs, each its share of the heads and the states
    # four sequences decoding 1,000 tokens of context each: 12 full layers' KV (2 KV heads of 256) and 36 states
    # read and written, 2 x 36 x 1,097,728 x 4 = 316,145,664 bytes
    kv, states = 12 * (2 * 2 * 256 * 2) * 4000, 2 * 36 * 1_097_728 * 4
    assert (kv, states) == (98_304_000, 316_145_664)
    parts = cost.step_parts(StepWork(decoders=4, decode_kv=4000))
    assert parts.decode_kv == pytest.approx((kv + states) / (bw * eff.decode_kv_eff), rel=1e-12)
    # products: 16 query heads of 256 over 12 layers' context, 7 FLOPs a state value (548,864 of them) a token
    flops = 4 * 16 * 256 * 12 * 4000 + 7 * 36 * 548_864 * 4
    assert parts.decode_attention == pytest.approx(flops / (2 * H200_PEAK * eff.attention), rel=1e-12)
    # a prefill chunk starts from its cached state and writes the last one: 2 x 36 states beside the cached KV read
    chunk = cost.step_parts(StepWork.of([(544, 544)]))
    read = 12 * 2 * 16 * 256 * 2 * 544 + 2 * 36 * 1_097_728  # cached K/V once a query head, then the states
    assert chunk.kv_read == pytest.approx(read / (bw * eff.kv_read), rel=1e-12)


def test_a_full_attention_model_ignores_the_window_fields():
    cost = CostModel.from_names("llama-3-8b", "h200")
    work = StepWork.of([(512, 1024)], decoders=8, decode_kv=8 * 3000)
    assert cost.window == 0
    assert cost.step_time(work._replace(window_kv=1, window_pairs=1.0, window_cached=1)) == cost.step_time(work)


def test_the_scheduler_cuts_each_decoders_context_to_the_window():
    """A 100-token and a 1,000-token prompt in one step, then both decode: the window group reads 101 + 128 tokens,
    less than the bound two decoders x 128 would give."""
    cost = CostModel.from_names("gpt-oss-120b", "h200")
    pool = GroupedPool(BlockPool(1000, make_policy("lru"), block_size=16, hit_mode="prefix"), cost.model.kv_groups)
    sched = Scheduler(pool, cost)
    sched.submit(SchedRequest(1, list(range(1, 7)), 100, 5, 0.0))
    sched.submit(SchedRequest(2, list(range(100, 162)), 1000, 5, 0.0))
    first = sched.step(0.0)
    assert first.duration == pytest.approx(cost.step_time(StepWork.of([(100, 0), (1000, 0)], window=128)))
    second = sched.step(first.duration, horizon=first.duration)  # one step (no decode run)
    exact = StepWork(decoders=2, decode_kv=101 + 1001, window_kv=101 + 128)
    assert second.duration == pytest.approx(cost.step_time(exact), rel=1e-12)
    assert second.duration < cost.step_time(exact._replace(window_kv=-1))  # the bound: 256 window tokens
