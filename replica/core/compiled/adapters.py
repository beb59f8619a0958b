"""What each policy the compiled pool has gives the extension, and how the state it reached goes back.

The policies stay the definition (``replica/core/cache/policies``) and know nothing of C; this module
is the other half of ``_pool.c`` for each of them: the kernel's settings for a fresh policy of exactly
that class, and the write-back that makes the Python policy what the same calls would have made it
(its order, counters, next uses). The policy kinds and refusal codes come from the extension, which
defines them once. The write-backs reach into the policies' private state: they are that state's twin,
and ``tests/replica/core/compiled/test_compiled_pool.py`` compares both whole after every replay.

To compile another policy: a kind in ``_pool.c`` (exported in its module init), an ``Adapter`` here
registered in ``ADAPTERS``, and its case in the equivalence test's ``CASES``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import repeat
from types import ModuleType
from typing import Any

from replica.core.cache.policies.base import EvictionPolicy
from replica.core.cache.policies.belady import BeladyComputePolicy, BeladyPolicy
from replica.core.cache.policies.lru import LRUPolicy
from replica.core.cache.policies.s3fifo import S3FIFOPolicy
from shared.native import load

__all__ = ["ADAPTERS", "MISSING", "Adapter", "adapter_for", "kernel_module"]

kernel_module: ModuleType | None
kernel_module, MISSING = load("replica.core.compiled._pool")

# What the kernel's ``state()`` holds (beyond the pool's blocks, pins and metrics): list and map
# names as the extension writes them.
State = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Adapter:
    """One compiled policy: ``kind`` names the extension's constant; ``params`` gives the kernel's
    settings (beyond ``kind``) or None when the policy is not fresh (the kernel starts empty);
    ``load`` writes the kernel's state into the policy; ``view`` is the policy's state as the
    equivalence tests compare it (``snapshot.PoolSnapshot``: what a later request could tell apart;
    it reads the pool's pin counts); ``cost_aware``: the kernel reads the policy's cost per depth
    (``set_policy_costs``); ``stores``: the kernel's ``store`` (kept response KV) and ``remove`` (a tier
    level's fetched blocks) have the policy."""

    kind: str
    params: Callable[[Any], dict[str, int] | None]
    load: Callable[[Any, State], None]
    view: Callable[[Any, Mapping[int, int]], dict[str, Any]]
    cost_aware: bool = False
    stores: bool = False


def adapter_for(policy: EvictionPolicy) -> Adapter | None:
    """The adapter of exactly this policy's class (a subclass may order blocks differently)."""
    return ADAPTERS.get(type(policy))


# ---- LRU: one queue, eviction end first ---------------------------------------------------
def _lru_params(p: LRUPolicy) -> dict[str, int] | None:
    return None if p._queue else {}


def _lru_load(p: LRUPolicy, state: State) -> None:
    p._queue.clear()
    p._queue.update(zip(state["order"], repeat(None)))


def _lru_view(p: LRUPolicy, pins: Mapping[int, int]) -> dict[str, Any]:
    return {"order": list(p._queue)}


# ---- S3-FIFO: small, main and ghost, each from its eviction end; a counter per block -------
def _s3fifo_params(p: S3FIFOPolicy) -> dict[str, int] | None:
    # a ghost far larger than the pool would make the kernel's fixed ghost table the larger part
    if p._freq or p._ghost or p._evicted or p.ghost_size > 8 * p.ctx.capacity:
        return None
    return {"small_size": p.small_size, "main_size": p.main_size, "ghost_size": p.ghost_size,
            "threshold": p.threshold}


def _s3fifo_load(p: S3FIFOPolicy, state: State) -> None:
    p.clear()
    p._freq.update(state["counters"])
    p._small.extend(state["order"])
    p._main.extend(state["main"])
    p._ghost.update(zip(state["ghost"], repeat(None)))
    p._evicted = bool(state["evicted"])


def _s3fifo_view(p: S3FIFOPolicy, pins: Mapping[int, int]) -> dict[str, Any]:
    return {"counters": dict(p._freq), "small": list(p._small), "main": list(p._main), "ghost": list(p._ghost),
            "evicted": p._evicted}


# ---- Belady: a recorded next use per block; the heap holds the unpinned ones ----------------
def _belady_params(p: BeladyPolicy) -> dict[str, int] | None:
    return None if p._rec or p._heap else {}


def _belady_load(p: BeladyPolicy, state: State) -> None:
    p.clear()
    p._rec.update(state["next_use"])
    p._rebuild()


def _belady_view(p: BeladyPolicy, pins: Mapping[int, int]) -> dict[str, Any]:
    # the heap's layout is its own: what it would hand out is its live entries (an entry may repeat)
    nu = p._rec
    return {"next_use": dict(nu), "live": {e for e in p._heap if nu.get(-e[1]) == -e[0] and -e[1] not in pins}}


# ---- BeladyCompute: a record (next use, depth) per block; heaps per depth rebuilt -----------
def _belady_compute_params(p: BeladyComputePolicy) -> dict[str, int] | None:
    return None if p._rec or p._entries else {}


def _belady_compute_load(p: BeladyComputePolicy, state: State) -> None:
    p.clear()
    p._rec.update(state["records"])
    if p._rec:
        p._grow(max(d for _, d in p._rec.values()))
    p._rebuild()


def _belady_compute_view(p: BeladyComputePolicy, pins: Mapping[int, int]) -> dict[str, Any]:
    return {"records": dict(p._rec)}  # its heaps are rebuilt from the records on a write-back


ADAPTERS: dict[type[EvictionPolicy], Adapter] = {
    LRUPolicy: Adapter("KIND_LRU", _lru_params, _lru_load, _lru_view, stores=True),
    S3FIFOPolicy: Adapter("KIND_S3FIFO", _s3fifo_params, _s3fifo_load, _s3fifo_view, stores=True),
    BeladyPolicy: Adapter("KIND_BELADY", _belady_params, _belady_load, _belady_view),
    BeladyComputePolicy: Adapter("KIND_BELADY_COMPUTE", _belady_compute_params, _belady_compute_load,
                                 _belady_compute_view, cost_aware=True),
}
