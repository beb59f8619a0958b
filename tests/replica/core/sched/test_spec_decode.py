"""Speculative decoding in the scheduler (replica/core/sched/spec_decode.py), worked by hand."""

from __future__ import annotations

import pytest

from replica.core.cache.policies.lru import LRUPolicy
from replica.core.cache.pool import BlockPool
from replica.core.sched.sched_types import SchedRequest, SchedulerSettings
from replica.core.sched.scheduler import Scheduler
from replica.core.sched.spec_decode import (
    ForcedAcceptance,
    LengthAcceptance,
    RateAcceptance,
    SpecDecode,
    parse_lengths,
)
from shared.costmodel import CostModel, StepWork
from shared.errors import InputError
from shared.hashing import block_hashes
from shared.spec_cost import NGRAM_S_PER_TOKEN, draft_seconds


def _one_sequence(accept: list[int]) -> tuple[Scheduler, BlockPool, SchedRequest]:
    """K = 2, blocks of 16, a 30-token prompt and 6 output tokens."""
    pool = BlockPool(100, LRUPolicy(), block_size=16, hit_mode="prefix", emit_events=False)
    spec = SpecDecode("ngram", 2, acceptance_rate=1.0)
    sched = Scheduler(pool, CostModel.from_names("llama-3-8b"), SchedulerSettings(token_budget=256, max_running=8,
                                                                                 speculative=spec),
                      keep_response_kv=True)
    sched.acceptance = ForcedAcceptance({0: accept})
    full = block_hashes(list(range(1, 36)), 16)  # prompt and output but the last token: 2 full blocks
    r = SchedRequest(0, full[:1], 30, 6, 0.0, response_hashes=full[1:])
    sched.submit(r)
    return sched, pool, r


def test_k2_accepting_2_0_1_keeps_3_1_1_tokens_and_finishes_in_the_third_verify_step():
    sched, pool, r = _one_sequence([2, 0, 1])
    seen = []
    for k in range(4):
        res = sched.step(float(k), horizon=float(k))
        seen.append((res.prefill_tokens, [n for _, n in res.decoded], len(res.finished), pool.pinned, pool.private))
    # step 0: the 30-token prefill (blocks: 1 hashed + the partial tail); step 1: 1 + 2 tokens need slots up to
    # 33, a third block; all accepted: 3 kept (34 tokens), block 2 full -> hashed at step 2 (pinned 2, private 1);
    # step 2 accepts none: 1 kept (35); step 3 accepts 1 but only 1 token is left: it finishes, nothing held
    assert seen == [(30, [], 0, 1, 1), (0, [3], 0, 1, 2), (0, [1], 0, 2, 1), (0, [1], 1, 0, 0)]
    assert r.generated == 6 and r.verifies == 3
    stats = sched.stats()
    assert (stats["spec_verifies"], stats["spec_draft_tokens"], stats["spec_accepted_tokens"]) == (3, 6, 3)
    assert stats["spec_mean_accepted_length"] == 2.0 and stats["spec_acceptance_rate"] == 0.5


def test_a_verify_step_costs_one_forward_over_k_plus_1_tokens_a_sequence():
    cost = CostModel.from_names("llama-3-8b")
    sched, _, _ = _one_sequence([0, 0, 0])
    sched.step(0.0, horizon=0.0)
    res = sched.step(1.0, horizon=1.0)
    kv = 31  # 30 prompt tokens and the first sampled one
    forward = cost.step_time(StepWork(decoders=1, decode_kv=kv, draft_tokens=2, draft_kv=2 * kv))
    assert res.duration == pytest.approx(forward + kv * NGRAM_S_PER_TOKEN)
    # 8 sequences of K = 3: 32 query tokens, the same products as 32 decoders, the KV read once a sequence
    many = StepWork(decoders=8, decode_kv=8000, draft_tokens=24, draft_kv=24000)
    assert many.tokens == 32
    parts = cost.step_parts(many)
    assert parts.linear == pytest.approx(cost.step_parts(StepWork(decoders=32, decode_kv=8000)).linear)
    assert parts.decode_kv == cost.step_parts(StepWork(decoders=8, decode_kv=8000)).decode_kv


def test_drafters_cost_ngram_by_context_and_model_drafters_k_passes():
    cost = CostModel.from_names("llama-3-8b")
    assert draft_seconds(cost, "ngram", 4, 8, 10_000) == pytest.approx(10_000 * NGRAM_S_PER_TOKEN)
    eagle2, eagle4 = draft_seconds(cost, "eagle", 2, 8, 10_000), draft_seconds(cost, "eagle", 4, 8, 10_000)
    assert eagle4 == pytest.approx(2 * eagle2)
    # one layer of 32 is far less than a decode step of the whole model
    assert 0 < eagle2 / 2 < cost.decode_step_time(8, 10_000) / 8
    assert draft_seconds(cost, "mtp", 3, 0, 0) == 0.0


def test_acceptance_models_draw_what_they_say():
    rate = RateAcceptance(0.6, seed=3)
    draws = [rate.accepted(rid, step, 4) for rid in range(200) for step in range(50)]
    expected = sum(0.6**i for i in range(1, 5))  # E[a] = sum P(a >= i)
    assert sum(draws) / len(draws) == pytest.approx(expected, rel=0.03)
    assert draws == [rate.accepted(rid, step, 4) for rid in range(200) for step in range(50)]  # seeded
    assert RateAcceptance(1.0).accepted(5, 0, 3) == 3
    lengths = LengthAcceptance((0.5, 0.0, 0.5))
    got = [lengths.accepted(rid, 0, 2) for rid in range(4000)]
    assert set(got) == {0, 2} and got.count(2) / len(got) == pytest.approx(0.5, abs=0.03)
    assert LengthAcceptance((0.0, 0.0, 1.0)).accepted(1, 1, 1) == 1  # never more than the drafts scheduled


@pytest.mark.parametrize("kwargs, field", [
    ({"method": "medusa", "num_tokens": 2, "acceptance_rate": 0.5}, "method"),
    ({"method": "ngram", "num_tokens": 0, "acceptance_rate": 0.5}, "num_tokens"),
    ({"method": "ngram", "num_tokens": -1, "acceptance_rate": 0.5}, "num_tokens"),
    ({"method": "ngram", "num_tokens": 2, "acceptance_rate": 1.5}, "acceptance_rate"),
    ({"method": "ngram", "num_tokens": 2}, "acceptance_rate"),
    ({"method": "eagle", "num_tokens": 2, "acceptance_lengths": (0.5, 0.3)}, "acceptance_lengths"),
    ({"method": "eagle", "num_tokens": 1, "acceptance_lengths": (0.5, 0.3, 0.2)}, "acceptance_lengths"),
])
def test_bad_settings_are_one_line_naming_the_field(kwargs, field):
    with pytest.raises(InputError) as e:
        SpecDecode(**kwargs)
    assert e.value.field == field and "\n" not in str(e.value)


def test_lengths_parse_from_a_list_or_a_file(tmp_path):
    assert parse_lengths("0.2,0.3,0.5") == (0.2, 0.3, 0.5)
    f = tmp_path / "al.txt"
    f.write_text("0.25\n0.25\n0.5\n")
    assert parse_lengths(str(f)) == (0.25, 0.25, 0.5)
    with pytest.raises(InputError):
        parse_lengths("nofile")


def test_a_budget_too_small_for_every_decoder_s_drafts_is_refused():
    with pytest.raises(InputError, match="token budget"):
        SchedulerSettings(token_budget=64, max_running=16, speculative=SpecDecode("ngram", 4, acceptance_rate=0.5))
