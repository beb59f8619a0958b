"""What a pool of KV cache groups holds, group by group (replica/core/cache/grouped.py): the ``kv_groups``
section of ``/stats`` (``kv_groups_now``) and of the sim JSON (``GroupSampler``, per step).

Blocks are counted from the running requests' block tables, as vLLM's per-request tables hold them: a request
of ``b`` blocks (its prompt's, what decoding filled and its private ones) holds ``b`` in a full-attention group
and ``b`` less what the window has passed in a window group (``GroupedAllocation.freed``: blocks its window
freed, or skipped at a prefix hit). A block two running requests share counts for each. The cost is one pass
over the running requests, never over the cache.

A model of one group has no such section: its one group's figures are the pool's own (``pinned_blocks``,
``private_blocks``), and the reports of full-attention models stay as they were.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from replica.core.cache.grouped import GroupedAllocation, GroupedPool
from shared.kv_groups import WINDOW, KvGroups

if TYPE_CHECKING:
    from replica.core.sched.sched_types import SchedRequest


def grouped_pool(pool: object) -> GroupedPool | None:
    """The pool of KV cache groups a scheduler serves from, where it has several groups."""
    return pool if isinstance(pool, GroupedPool) and pool.groups.hybrid else None


def held_now(pool: GroupedPool, running: Iterable[SchedRequest]) -> tuple[list[int], list[int]]:
    """Per group, the blocks the running requests' tables hold and those their windows let go of."""
    held, freed = [0] * pool.width, [0] * pool.width
    for r in running:
        alloc = r.alloc
        if not isinstance(alloc, GroupedAllocation):
            continue
        for g, n in enumerate(pool.held_per_group(alloc, r.extra_blocks + r.fill_pins)):
            held[g] += n
            freed[g] += alloc.freed[g]
    return held, freed


def describe(groups: KvGroups) -> dict:
    """The groups as ``/stats`` and the sim JSON show them: layers a group (a block is one group's page)."""
    return {"count": len(groups.groups), "layers_per_group": groups.group_size, "groups": groups.describe()}


def kv_groups_now(pools: Iterable[tuple[GroupedPool, Iterable[SchedRequest]]]) -> dict | None:
    """``/stats``'s section: per group its blocks held now and let go of by its window, over every
    data-parallel rank's pool (``(pool, running requests)`` each); None for a model of one group."""
    out: dict | None = None
    for pool, running in pools:
        held, freed = held_now(pool, running)
        if out is None:
            out = describe(pool.groups)
        for row, h, f in zip(out["groups"], held, freed, strict=True):
            row["held_blocks"] = row.get("held_blocks", 0) + h
            if row["kind"] == WINDOW:
                row["window_freed_blocks"] = row.get("window_freed_blocks", 0) + f
    return out


class GroupSampler:
    """One instance's blocks per group over a simulated run: sampled after each scheduler step, weighed by the
    step's duration (the mean is over the busy time), and the most held after any step."""

    def __init__(self, pool: GroupedPool) -> None:
        self.pool = pool
        self.seconds = 0.0
        self.held_s = [0.0] * pool.width
        self.freed_s = [0.0] * pool.width
        self.peak = [0] * pool.width

    def sample(self, running: Iterable[SchedRequest], duration: float) -> None:
        held, freed = held_now(self.pool, running)
        self.seconds += duration
        for g in range(self.pool.width):
            self.held_s[g] += held[g] * duration
            self.freed_s[g] += freed[g] * duration
            self.peak[g] = max(self.peak[g], held[g])


def kv_groups_run(samplers: list[GroupSampler]) -> dict | None:
    """The sim JSON's section, an instance's figures: per group the mean blocks held (each instance's mean over its
    busy time, averaged over the instances that ran a step), the most one instance held after a step, and the mean
    its windows let go of; None for a model of one group."""
    if not samplers:
        return None
    out = describe(samplers[0].pool.groups)
    ran = [s for s in samplers if s.seconds > 0]
    for g, row in enumerate(out["groups"]):
        row["mean_held_blocks"] = round(sum(s.held_s[g] / s.seconds for s in ran) / len(ran), 1) if ran else 0.0
        row["peak_held_blocks"] = max(s.peak[g] for s in samplers)
        if row["kind"] == WINDOW:
            row["mean_window_freed_blocks"] = round(sum(s.freed_s[g] / s.seconds for s in ran) / len(ran), 1) \
                if ran else 0.0
    return out
