"""One request through HBM and the levels below it, as the scheduler serves one: the tier tests' step."""

from __future__ import annotations

from replica.core.cache.pool import BlockPool
from replica.core.cache.types import Lookup
from replica.core.tiers.stack import FetchPlan, TierStack


def serve(hbm: BlockPool, tiers: TierStack, hashes: list[int], now: float = 0.0) -> FetchPlan:
    """Plan the fetches, allocate in HBM, complete the plan (demotions, promotions); the plan."""
    plan = tiers.plan(hashes, now)
    alloc = hbm.serve(Lookup(hashes, now=now))
    tiers.complete(plan, alloc.hashes, alloc.hit_idx, alloc.new_idx, now)
    return plan
