"""The whole state of a pool, its policy and its metrics, typed: what the compiled twin must equal.

The equivalence tests (``tests/replica/core/compiled/test_compiled_pool.py``) drive a ``BlockPool``
and a ``CompiledPool`` with the same calls and compare ``PoolSnapshot.of`` both: everything a
later request, a report or the index could tell apart. A compiled pool is settled first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from replica.core.cache.pool import BlockPool
from replica.core.compiled.adapters import adapter_for
from replica.core.compiled.pool import CompiledPool

__all__ = ["PoolSnapshot"]


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """Resident blocks in insertion order with owners, footprints in the order sessions entered,
    blocks reused since inserted, pins, unhashed blocks held, the clock, the report, the metrics'
    counters, and the policy's own state (its adapter's ``view``)."""

    resident: list[tuple[int, str | None]]
    footprint: list[tuple[str | None, int]]
    reused: frozenset[int]
    refs: dict[int, int]
    pins: int
    private: int
    now: float
    stats: dict[str, Any]
    metrics: dict[str, Any]
    policy: dict[str, Any]

    @classmethod
    def of(cls, pool: BlockPool | CompiledPool) -> PoolSnapshot:
        if isinstance(pool, CompiledPool):
            pool = pool.settle()
        adapter = adapter_for(pool.policy)
        if adapter is None:
            raise ValueError(f"policy {pool.policy.name} has no compiled twin to compare with")
        refs = pool.pin_counts
        # costs and reuse are shared objects (the cost table, the deferred reuse tracker), not counters
        counters = {k: v for k, v in vars(pool.metrics).items() if k not in ("costs", "reuse")}
        return cls(list(pool.resident.items()), list(pool.footprint.items()), frozenset(pool._reused), dict(refs),
                   pool._pins, pool.private, pool.now, pool.stats(top_k=50), counters, adapter.view(pool.policy, refs))
