"""Offline oracles (simulator only, ``needs_future = True``): Belady and BeladyCompute.

The simulator passes ``Access.next_use[i]``: the position of block i's next access in the
order the cache sees accesses (request order, then position in the request; ``inf`` when
never again), and ``ctx.position``, the position of the request being served. Positions,
not timestamps: requests that share a timestamp would otherwise tie and let the oracle
evict the wrong block. A missing ``next_use`` counts as ``inf``.

Each policy keeps, per known block, its latest next use. As in vLLM's free queue, a block
leaves the evictable order while it is pinned: ``on_access`` only records the new next
use, ``on_release`` pushes the block when its last pin goes. Heaps hold (key, block)
entries and are cleaned lazily: an entry is stale when the block's current record differs
from it or the block is pinned: ``on_pin`` (before the pool asks for victims) drops a block's
record and ``on_access`` records its next use again, which can equal an old entry's (a
preempted request re-admitted has the same next uses), so a pinned block's entries are
skipped by the pin itself; it is pushed anew on release. Heaps are rebuilt when
stale entries outnumber live ones. So a victims call never re-pushes pinned entries, which
under continuous batching (hundreds of requests pinning their blocks) cost minutes.

* Belady: evict the farthest next use (``inf`` first); ties: larger block hash first.
  With equal-size blocks and holes-mode hits this minimises misses.
* BeladyCompute (When Fancy Eviction Fails): evict the largest ``(next_use - now) / cost(depth)``, ``cost``
  the pool's recompute cost at the block's depth (its index in the request). Blocks never
  used again come first (score ``inf``), the cheapest of them first. Exact: for a fixed
  depth the cost is fixed, so within one depth the order by score is the order by next
  use at every ``now``; one max-heap per depth holds the finite blocks. Across depths a
  heap ranks each depth by an upper bound of its top's score: a score taken at an earlier
  ``now``, or before its top was evicted or went stale, only overestimates (scores fall as
  ``now`` grows and a depth's top only moves to a nearer next use), and a release that
  pushes a farther next use marks its depth for re-scoring. ``victims`` re-scores the bound
  that comes first until one is exact at this ``now``: that depth holds the exact argmax over
  all resident unpinned blocks, found without scoring every depth (if ``now`` steps back,
  every depth is re-scored once). ``now`` is ``ctx.position``, the position of the request
  that needs space (the pool calls ``victims`` before that request's ``on_access``). Ties:
  larger block hash first.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush, heapreplace
from itertools import repeat
from math import inf

from replica.core.cache.policies.base import Access, EvictionPolicy


def _every_block(acc: Access) -> bool:
    """The request touched or inserted every one of its blocks (always so from the pool)."""
    return len(acc.touched_idx) + len(acc.new_idx) == len(acc.hashes)


def _next_uses(acc: Access):
    """(depth, next use) of every block the request touched or inserted."""
    nu = acc.next_use
    if _every_block(acc):
        return zip(range(len(acc.hashes)), repeat(inf) if nu is None else nu)
    idx = acc.touched_idx + acc.new_idx
    return [(i, inf if nu is None else nu[i]) for i in idx]


class _NextUseOracle(EvictionPolicy):
    """What both oracles share: the simulator's next uses, pins, and a record per known block (``_rec``,
    its latest next use) that a pin drops, so the block's heap entries are stale until its release."""

    needs_future = True
    takes_pins = True
    # a preempted request's uncomputed blocks stay (Scheduler._preempt): the compiled twin's next-use
    # order has no removal, and both pools must report the same
    drops_uncomputed = False
    _rec: dict

    def __init__(self) -> None:
        self.clear()

    def on_pin(self, hashes) -> None:
        pop = self._rec.pop
        for h in hashes:
            pop(h, None)  # its heap entries are stale from now on

    def on_remove(self, h: int) -> None:
        self._rec.pop(h, None)


class BeladyPolicy(_NextUseOracle):
    name = "belady"

    def clear(self) -> None:
        self._rec: dict[int, float] = {}  # block -> next use
        self._heap: list[tuple[float, int]] = []  # (-next use, -block) of unpinned blocks: a max-heap

    def on_access(self, acc: Access) -> None:
        hashes, nu = acc.hashes, acc.next_use  # pinned now: enters the heap on release
        if _every_block(acc):  # C-level zips
            self._rec.update(zip(hashes, repeat(inf) if nu is None else nu))
        else:
            self._rec.update((hashes[i], t) for i, t in _next_uses(acc))

    def on_release(self, hashes, now: float) -> None:
        nu, heap = self._rec, self._heap
        for h in hashes:
            t = nu.get(h)
            if t is not None:
                heappush(heap, (-t, -h))
        if len(heap) > 2 * len(nu) + 1024:
            self._rebuild()

    def _rebuild(self) -> None:
        """The heap of every unpinned block's current next use: no stale entry left."""
        pinned = self.ctx.pinned
        self._heap = [(-t, -h) for h, t in self._rec.items() if h not in pinned]
        heapify(self._heap)

    def victims(self, need: int) -> list[int]:
        nu, heap, pinned = self._rec, self._heap, self.ctx.pinned
        out: list[int] = []
        while len(out) < need:
            if not heap:
                raise RuntimeError(f"{self.name}: asked for {need} victims, only {len(out)} evictable")
            entry = heappop(heap)
            h = -entry[1]
            if nu.get(h) != -entry[0] or h in pinned:
                continue  # stale: accessed again since it was pushed (it returns on release)
            del nu[h]
            out.append(h)
        return out


class BeladyComputePolicy(_NextUseOracle):
    name = "belady_compute"

    def clear(self) -> None:
        self._rec: dict[int, tuple[float, int]] = {}  # block -> (next use, depth)
        self._never: list[tuple[float, int, int]] = []  # (cost, -block, depth) of next use inf
        self._heaps: list[list[tuple[float, int]]] = []  # by depth: [(-next use, -block)]
        self._entries = 0
        # Depths ranked by an upper bound of their top's score: (-score, -block, depth, version,
        # now scored at, the depth heap's entry scored). A depth's live entry is its latest version.
        self._ranked: list[tuple] = []
        self._ver: list[int] = []  # by depth
        self._scored_t: list[float] = []  # by depth: next use its live entry was scored with (-inf: none)
        self._cost: list[float] = []  # by depth: recompute cost, floored above 0
        self._dirty: set[int] = set()  # depths whose top may exceed what their live entry scored
        self._ranked_at = -inf  # the latest victims call's now

    def _grow(self, depth: int) -> None:
        while len(self._heaps) <= depth:
            self._cost.append(max(self.ctx.block_cost(len(self._heaps)), 1e-300))
            self._heaps.append([])
            self._ver.append(0)
            self._scored_t.append(-inf)

    def on_access(self, acc: Access) -> None:
        hashes, nu = acc.hashes, acc.next_use  # pinned now: enters a heap on release
        if _every_block(acc):  # C-level zips
            self._rec.update(zip(hashes, zip(repeat(inf) if nu is None else nu, range(len(hashes)))))
        else:
            self._rec.update((hashes[i], (t, i)) for i, t in _next_uses(acc))

    def on_release(self, hashes, now: float) -> None:
        rec, heaps, scored, dirty = self._rec, self._heaps, self._scored_t, self._dirty
        pushed = 0
        for h in hashes:  # only the blocks no request holds any more: their depths vary
            r = rec.get(h)
            if r is None:
                continue
            t, d = r
            if d >= len(heaps):
                self._grow(d)  # extends these lists in place
            if t == inf:
                heappush(self._never, (self._cost[d], -h, d))
            else:
                heappush(heaps[d], (-t, -h))
                if t >= scored[d]:
                    dirty.add(d)
            pushed += 1
        self._entries += pushed
        if self._entries > 4 * len(rec) + 1024:
            self._rebuild()

    def _rebuild(self) -> None:
        """Drop stale entries: every unpinned block's current record, heapified per depth."""
        pinned, cost = self.ctx.pinned, self._cost
        never: list[tuple[float, int, int]] = []
        heaps: list[list[tuple[float, int]]] = [[] for _ in self._heaps]
        for h, (t, d) in self._rec.items():
            if h not in pinned:
                if t == inf:
                    never.append((cost[d], -h, d))
                else:
                    heaps[d].append((-t, -h))
        for heap in heaps:
            heapify(heap)
        heapify(never)
        self._never, self._heaps, self._entries = never, heaps, len(self._rec)
        self._ranked, self._scored_t = [], [-inf] * len(heaps)
        self._dirty = {d for d, heap in enumerate(heaps) if heap}

    def _top(self, d: int) -> tuple | None:
        """Clean depth ``d``'s heap top: drop stale entries (``on_pin`` made a pinned block's stale)."""
        rec, heap, pinned = self._rec, self._heaps[d], self.ctx.pinned
        while heap:
            entry = heap[0]
            h = -entry[1]
            r = rec.get(h)
            if r is None or r[0] != -entry[0] or r[1] != d or h in pinned:
                heappop(heap)  # stale: touched again since it was pushed (it returns on release)
            else:
                return entry
        return None

    def _never_top(self) -> bool:
        rec, heap, pinned = self._rec, self._never, self.ctx.pinned
        while heap:
            cost, nh, d = heap[0]
            h = -nh
            r = rec.get(h)
            if r is None or r[0] != inf or r[1] != d or h in pinned:
                heappop(heap)
            else:
                return True
        return False

    def _rank(self, d: int, now: float) -> tuple | None:
        """Depth ``d``'s new live entry, its valid top scored at ``now`` (None: no top)."""
        ver = self._ver[d] = self._ver[d] + 1
        entry = self._top(d)
        if entry is None:
            self._scored_t[d] = -inf
            return None
        self._scored_t[d] = -entry[0]
        # A next use at or before now cannot happen with positions; clamp all the same so it
        # would rank as the most urgent, never as a negative score.
        score = max(-entry[0] - now, 1e-9) / self._cost[d]
        return (-score, entry[1], d, ver, now, entry)

    def _prepare_ranks(self, now: float) -> None:
        """Bring every depth's live entry to an upper bound of its score at ``now``."""
        if now < self._ranked_at:  # scores rise as now falls: the bounds no longer hold
            self._ranked, self._scored_t = [], [-inf] * len(self._heaps)
            self._dirty.update(d for d, heap in enumerate(self._heaps) if heap)
        self._ranked_at = now
        ranked = self._ranked
        for d in self._dirty:
            live = self._rank(d, now)
            if live is not None:
                heappush(ranked, live)
        self._dirty.clear()
        if len(ranked) > 2 * len(self._ver) + 1024:  # drop superseded entries
            ver = self._ver
            self._ranked = [e for e in ranked if e[3] == ver[e[2]]]
            heapify(self._ranked)

    def _best_depth(self, now: float) -> int:
        """Pop the exact best live entry (best first over upper bounds); its depth."""
        ranked, ver = self._ranked, self._ver
        while ranked:
            best = ranked[0]
            d = best[2]
            if best[3] != ver[d]:
                heappop(ranked)  # superseded
            elif best[4] == now and self._top(d) is best[5]:
                heappop(ranked)  # scored at this now and still the depth's valid top: exact
                return d
            else:
                live = self._rank(d, now)  # a bound: score it now, it may still come first
                if live is None:
                    heappop(ranked)
                else:
                    heapreplace(ranked, live)
        return -1

    def victims(self, need: int) -> list[int]:
        rec, heaps, now = self._rec, self._heaps, self.ctx.position
        out: list[int] = []
        while len(out) < need and self._never_top():
            h = -heappop(self._never)[1]
            del rec[h]
            out.append(h)
        if len(out) == need:
            return out
        self._prepare_ranks(now)
        ranked = self._ranked
        while len(out) < need:
            d = self._best_depth(now)
            if d < 0:
                raise RuntimeError(f"{self.name}: asked for {need} victims, only {len(out)} evictable")
            while True:  # evict from depth d while its next top still beats every other bound
                h = -heappop(heaps[d])[1]
                del rec[h]
                out.append(h)
                live = self._rank(d, now)
                if live is None:
                    break
                if len(out) == need or (ranked and ranked[0] < live):
                    heappush(ranked, live)
                    break
        return out
