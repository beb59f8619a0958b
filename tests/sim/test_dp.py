"""Data-parallel instances in virtual time (sim/dp.py): a DP 2 + EP instance is not two independent replicas."""

from __future__ import annotations

import pytest

from loadgen.trace import Trace, TraceRequest
from shared.costmodel import CostModel, StepWork
from shared.errors import InputError
from shared.expert_parallel import ExpertParallel
from sim.run import simulate
from sim.settings import SimSettings

MODEL, GPU, BS = "qwen3-coder-30b-a3b", "h200", 16
P = 4 * BS  # each prompt: 4 blocks


def _run(replicas: int, dp: int = 1, ep: bool = False, routing: str = "round_robin") -> dict:
    # two requests at once, distinct prompts of 64 tokens, 2 output tokens: a prefill step and a decode step each
    reqs = [TraceRequest(0.0, "a", 0, [1, 2, 3, 4], P, 2), TraceRequest(0.0, "b", 0, [5, 6, 7, 8], P, 2)]
    s = SimSettings(capacity_blocks=64, replicas=replicas, routing=routing, model=MODEL, gpu=GPU,
                    data_parallel_size=dp, expert_parallel=ep)
    return simulate(Trace(reqs, BS, "hand"), s, records=True)


def test_dp2_with_ep_steps_in_lockstep_where_two_replicas_step_alone():
    cost = CostModel.from_names(MODEL, GPU)
    ep = ExpertParallel(cost, 2)
    prefill, decode = StepWork.of([(P, 0)]), StepWork(decoders=1, decode_kv=P + 1)
    # two replicas: each request alone, its prefill then one decode step over its 64 prompt tokens and the first
    alone = _run(replicas=2)
    first = cost.step_time(prefill)
    e2e = first + cost.step_time(decode)
    assert [r.e2e_s for r in alone["request_records"]] == pytest.approx([e2e, e2e], rel=1e-9)
    # DP 2 + EP: one request a rank (waiting x 4 + running), both ranks' steps together: each rank's experts are
    # touched by both ranks' tokens, and each step ends with the all-to-alls of the larger rank's tokens
    group = _run(replicas=1, dp=2, ep=True)
    step1 = ep.rank_step_s(prefill, 2 * P) + ep.all_to_all_s(P)
    step2 = ep.rank_step_s(decode, 2) + ep.all_to_all_s(1)
    assert [r.ttft_s for r in group["request_records"]] == pytest.approx([step1, step1], rel=1e-9)
    assert [r.e2e_s for r in group["request_records"]] == pytest.approx([step1 + step2] * 2, rel=1e-9)
    assert step1 + step2 != pytest.approx(e2e, rel=1e-3)
    dp = group["data_parallel"]
    assert dp["routed_per_rank"] == [[1, 1]] and dp["lockstep_steps"] == 2 and dp["dummy_rank_steps"] == 0
    assert [(p["instance"], p["dp_rank"], p["requests"]) for p in group["per_replica"]] == [
        ("replica-0", 0, 1), ("replica-0", 1, 1)]


def test_dp2_without_ep_is_two_engines_behind_one_balancer():
    # no lockstep: each rank steps alone, so the times are those of two replicas
    group, alone = _run(replicas=1, dp=2), _run(replicas=2)
    assert [r.e2e_s for r in group["request_records"]] == [r.e2e_s for r in alone["request_records"]]
    assert group["data_parallel"]["lockstep_steps"] is None


def test_expert_parallel_on_a_dense_model_or_one_rank_is_refused():
    with pytest.raises(InputError, match="data_parallel_size 2"):
        SimSettings(capacity_blocks=64, expert_parallel=True)
    reqs = [TraceRequest(0.0, "a", 0, [1], BS, 2)]
    with pytest.raises(InputError, match="would do nothing"):
        simulate(Trace(reqs, BS, "hand"), SimSettings(capacity_blocks=64, model="llama-3-8b", data_parallel_size=2,
                                                       expert_parallel=True))


@pytest.mark.parametrize("python_core", [False, True], ids=["compiled_pools", "python_pools"])
def test_a_prefix_cached_on_rank_1_goes_to_rank_1_as_the_live_router_sends_it(python_core):
    # a and b at once on one instance of two ranks: a to rank 0 (both idle, the lowest), b to rank 1 (rank 0's load
    # is a waiting: 4); c, later, extends b's prompt: the index holds it on rank 1 only, so c goes there
    # (fold_ranks, chosen_rank), where balancing alone (both ranks idle by then) would send it to rank 0; d, a prompt
    # no rank holds, is balanced: rank 0
    reqs = [TraceRequest(0.0, "a", 0, [1, 2, 3, 4], P, 2), TraceRequest(0.0, "b", 0, [5, 6, 7, 8], P, 2),
            TraceRequest(1.0, "c", 0, [5, 6, 7, 8, 9], P + BS, 2), TraceRequest(2.0, "d", 0, [10, 11], 2 * BS, 2)]
    s = SimSettings(capacity_blocks=64, routing="cache_aware", model=MODEL, gpu=GPU, data_parallel_size=2,
                    compiled=not python_core)
    run = simulate(Trace(reqs, BS, "hand"), s, records=True)
    assert [r.replica for r in run["request_records"]] == ["replica-0/dp0", "replica-0/dp1", "replica-0/dp1",
                                                           "replica-0/dp0"]
    assert [r.cached_tokens for r in run["request_records"]] == [0, 0, P, 0]
    assert run["data_parallel"]["routed_per_rank"] == [[2, 2]]
    assert run["engine"] == ("python" if python_core else "compiled")
