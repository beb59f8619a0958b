"""build_core: the one builder the live replica and the simulator share."""

import pytest

from replica.core.build import CoreSettings, EngineKnobs, build_core
from replica.core.cache.metrics import PoolMetrics
from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool
from replica.core.cache.types import Lookup
from shared.costmodel import CostModel
from shared.errors import InputError

COST = CostModel.from_names("qwen3-coder-30b-a3b", "h200")


def test_policy_and_metrics_share_the_cost_models_depth_costs():
    core = build_core(CoreSettings(capacity_blocks=64, block_size=16, knobs=EngineKnobs(policy="random_compute")), COST)
    ctx = core.pool.policy_context
    for depth in (0, 5, 40):
        assert ctx.block_cost(depth) == COST.block_cost(depth, 16) == core.metrics.block_cost(depth)
    assert ctx.block_cost(40) > ctx.block_cost(0)  # deeper blocks attend to more context


def test_policy_cost_does_not_depend_on_how_metrics_were_configured():
    pool = BlockPool(8, make_policy("belady_compute"), metrics=PoolMetrics(block_cost=lambda d: 100.0 + d),
                     block_cost=lambda d: 1.0 + d)
    assert pool.policy_context.block_cost(3) == 4.0 and pool.metrics.block_cost(3) == 103.0
    plain = BlockPool(8, make_policy("belady_compute"), metrics=PoolMetrics(block_cost=lambda d: 100.0 + d))
    assert plain.policy_context.block_cost(3) == 1.0  # no cost model given: unit cost, never the metrics'


def test_oracles_only_where_the_future_is_known():
    with pytest.raises(InputError, match="offline oracle"):
        build_core(CoreSettings(capacity_blocks=8, knobs=EngineKnobs(policy="belady")), COST)
    core = build_core(CoreSettings(capacity_blocks=8, oracles=True, reuse="exact", knobs=EngineKnobs(policy="belady")), COST)
    assert core.pool.policy.needs_future and core.metrics.reuse is not None


def test_policy_context_is_read_only():
    core = build_core(CoreSettings(capacity_blocks=8, reuse="off"), COST)
    core.pool.acquire(Lookup([1, 2]))
    ctx = core.pool.policy_context
    assert dict(ctx.pinned) == {1: 1, 2: 1} and 1 in ctx.owners
    with pytest.raises(TypeError):
        ctx.pinned[3] = 1  # type: ignore[index]
