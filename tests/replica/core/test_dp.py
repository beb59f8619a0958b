"""A data-parallel group: vLLM's rank balancing, and one expert-parallel lockstep step worked by hand."""

import pytest

from replica.core.build import CoreSettings, build_core
from replica.core.dp import DpGroup, DpSettings, pick_rank
from replica.core.sched.scheduler import SchedRequest
from shared.costmodel import CostModel, Efficiency, GpuSpec, ModelSpec
from shared.errors import InputError

# A toy MoE whose terms are round: one layer, hidden 4, one head of 4, experts of width 4, 2 experts, top-1,
# 1-byte weights; a GPU of 10,000 FLOP/s and 1,000 B/s, every efficiency 1, no fixed costs, NVLink 4.
TOY = ModelSpec("toy-moe", layers=1, q_heads=1, kv_heads=1, head_dim=4, hidden=4, intermediate=4, vocab=4,
                experts=2, active_experts=1, dtype_bytes=1,
                efficiency=Efficiency(linear=1.0, attention=1.0, kv_read=1.0, memory=1.0))
GPU = GpuSpec("toy-gpu", peak_flops=1e4, hbm_bandwidth=1e3, memory_bytes=1e9, tp_link="nvlink4")


def _group(expert_parallel: bool) -> DpGroup:
    cost = CostModel(TOY, GPU)
    cores = [build_core(CoreSettings(capacity_blocks=8, block_size=4, reuse="off", stream_tokens=False), cost)
             for _ in range(2)]
    return DpGroup(cores, cost, DpSettings(2, expert_parallel))


def test_a_lockstep_step_is_the_slowest_rank_and_its_dummy_plus_the_all_to_alls():
    # Per token outside the experts: attention 64 params and router 8, 144 FLOP; LM head 16. The fused-MoE kernel
    # (shared/moe_cost.py, no fixed cost at these efficiencies): max(experts x 48 B / 1,000 B/s, tokens x 96 FLOP /
    # 10,000 FLOP/s). Rank 0 prefills 4 tokens; rank 1 is idle and runs a dummy batch of 1 token: 5 tokens in all.
    # Rank 0 alone: weights 88 B -> 0.088 s (over products 4 x 144 + 32 = 608 FLOP, 0.0608 s), attention 6 pairs
    # x 16 = 96 FLOP -> 0.0096 s, MoE max(touched(4) = 2 (1 - 1/16) = 1.875 x 0.048, 4 x 0.0096) = 0.09 s: 0.1876 s.
    # Under EP its GPU gets 5 / 2 tokens' products and its 1 expert is touched by 5 tokens: MoE max(2 (1 - 1/32) / 2
    # = 0.96875 x 0.048 = 0.0465, 2.5 x 0.0096 = 0.024) = 0.0465 s. Rank 0: 0.088 + 0.0096 + 0.0465 = 0.1441 s.
    # The dummy (1 decoder, 1 KV token): weights 88 B plus 8 B of KV -> 0.096 s (products 144 + 32 + 16 = 192 FLOP,
    # 0.0192 s), MoE the same 0.0465 s. Rank 1: 0.1425 s.
    # All-to-all, as vLLM's default backend: an all-gather and a reduce-scatter over the layer, each of the larger
    # rank's 4 tokens x hidden 4 x 1 byte = 16 bytes a rank, 32 in all. NCCL's ring over NVLink 4 picks LL: latency
    # 6.6 + 1 hop x 0.6 = 7.2 us, bandwidth min(141 GB/s LL cap, 370 / 2) x 2 / 1 = 282 GB/s (Simple: 11.8 us).
    group = _group(expert_parallel=True)
    req = SchedRequest(1, [11], 4, 2, 0.0)
    assert group.submit(req) == 0
    step = group.lockstep_step(0.0)
    a2a = 2 * (7.2e-6 + 32 / 282e9)
    assert step.rank_s == pytest.approx([0.1441, 0.1425], rel=1e-12)
    assert step.all_to_all_s == pytest.approx(a2a, rel=1e-9)
    assert step.duration == pytest.approx(0.1441 + a2a, rel=1e-12)
    assert step.dummies == 1
    assert req.t_first_token == pytest.approx(0.1441 + a2a, rel=1e-12)  # the rank's step ends with the group's
    # without expert parallelism the same request alone takes the cost model's 0.1876 s
    alone = _group(expert_parallel=False)
    alone.submit(SchedRequest(1, [11], 4, 2, 0.0))
    assert alone.ranks[0].scheduler.step(0.0).duration == pytest.approx(0.1876, rel=1e-12)


def test_an_idle_group_steps_nothing_and_no_dummy():
    step = _group(expert_parallel=True).lockstep_step(0.0)
    assert step.duration == 0.0 and step.dummies == 2


def test_requests_go_to_the_least_waiting_x4_plus_running_rank_ties_to_the_lowest():
    group = _group(expert_parallel=False)
    assert group.submit(SchedRequest(1, [1], 4, 4, 0.0)) == 0  # 0, 0: the lowest
    assert group.submit(SchedRequest(2, [2], 4, 4, 0.0)) == 1  # 4 (one waiting), 0
    group.ranks[0].scheduler.step(0.0)  # rank 0's request now runs: 1 against rank 1's 4
    assert group.submit(SchedRequest(3, [3], 4, 4, 0.0)) == 0
    assert group.submit(SchedRequest(4, [4], 4, 4, 0.0), asked=1) == 1  # a request may name its rank
    assert group.routed == [2, 2]
    with pytest.raises(InputError, match="X-data-parallel-rank"):
        pick_rank(group.schedulers, 2)


def test_expert_parallelism_needs_two_ranks():
    with pytest.raises(InputError, match="data_parallel_size 2"):
        DpSettings(1, expert_parallel=True)


def test_each_rank_holds_its_share_of_the_experts_and_a_dense_model_refuses_the_flag():
    from shared.expert_parallel import check_expert_parallel
    from shared.memory_rule import weight_bytes
    # 168 params a layer (attention 64, router 8, 2 experts of 48) + embedding and head 2 x 16 = 200 bytes, 96 of
    # them experts; the norms 3 x 4 bytes on every GPU. One GPU: 212; two ranks splitting the experts: 104 + 48 + 12.
    cost = CostModel(TOY, GPU)
    assert weight_bytes(cost) == 212
    assert weight_bytes(cost, expert_ranks=2) == 164
    dense = ModelSpec("toy-dense", layers=1, q_heads=1, kv_heads=1, head_dim=4, hidden=4, intermediate=4, vocab=4)
    with pytest.raises(InputError, match="a flag that would do nothing"):
        check_expert_parallel(dense, True, 2)
