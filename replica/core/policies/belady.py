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
from it: ``on_pin`` (before the pool asks for victims) drops a block's record, so a pinned
block never has a valid entry; ``on_access`` records its next use. Heaps are rebuilt when
stale entries outnumber live ones. So a victims call never re-pushes pinned entries, which
under continuous batching (hundreds of requests pinning their blocks) cost minutes.

* Belady: evict the farthest next use (``inf`` first); ties: larger block hash first.
  With equal-size blocks and holes-mode hits this minimises misses.
* BeladyCompute (seed 002): evict the largest ``(next_use - now) / cost(depth)``, ``cost``
  the pool's recompute cost at the block's depth (its index in the request). Blocks never
  used again come first (score ``inf``), the cheapest of them first. Exact: for a fixed
  depth the cost is fixed, so within one depth the order by score is the order by next
  use at every ``now``; one max-heap per depth holds the finite blocks. A ``victims``
  call (one ``now``) scores the valid top of every depth heap once, keeps those scores
  in a heap, and after each eviction re-scores only the depth it came from: the exact
  argmax over all resident unpinned blocks, in O(depths + need · log) per call. ``now`` is
  ``ctx.position``, the position of the request that needs space (the pool calls ``victims``
  before that request's ``on_access``). Ties: larger block hash first.
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush
from math import inf

from replica.core.policies.base import Access, EvictionPolicy


def _next_uses(acc: Access):
    nu = acc.next_use
    if nu is None:
        return [(i, inf) for i in acc.touched_idx] + [(i, inf) for i in acc.new_idx]
    return [(i, nu[i]) for i in acc.touched_idx] + [(i, nu[i]) for i in acc.new_idx]


class BeladyPolicy(EvictionPolicy):
    name = "belady"
    needs_future = True
    takes_pins = True

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._nu: dict[int, float] = {}  # block -> next use
        self._heap: list[tuple[float, int]] = []  # (-next use, -block) of unpinned blocks: a max-heap

    def on_pin(self, hashes) -> None:
        pop = self._nu.pop
        for h in hashes:
            pop(h, None)  # its heap entries are stale from now on

    def on_access(self, acc: Access) -> None:
        nu, hashes = self._nu, acc.hashes
        for i, t in _next_uses(acc):
            nu[hashes[i]] = t  # pinned now: enters the heap on release

    def on_release(self, hashes, now: float) -> None:
        nu, heap = self._nu, self._heap
        for h in hashes:
            t = nu.get(h)
            if t is not None:
                heappush(heap, (-t, -h))
        if len(heap) > 2 * len(nu) + 1024:
            self._heap = [(-t, -h) for h, t in nu.items() if h not in self.ctx.pinned]
            heapify(self._heap)

    def victims(self, need: int) -> list[int]:
        nu, heap = self._nu, self._heap
        out: list[int] = []
        while len(out) < need:
            if not heap:
                raise RuntimeError(f"{self.name}: asked for {need} victims, only {len(out)} evictable")
            entry = heappop(heap)
            h = -entry[1]
            if nu.get(h) != -entry[0]:
                continue  # stale: accessed again since it was pushed (it returns on release)
            del nu[h]
            out.append(h)
        return out

    def on_remove(self, h: int) -> None:
        self._nu.pop(h, None)


class BeladyComputePolicy(EvictionPolicy):
    name = "belady_compute"
    needs_future = True
    takes_pins = True

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._rec: dict[int, tuple[float, int]] = {}  # block -> (next use, depth)
        self._never: list[tuple[float, int, int]] = []  # (cost, -block, depth) of next use inf
        self._by_depth: dict[int, list[tuple[float, int]]] = {}  # depth -> [(-next use, -block)]
        self._entries = 0

    def _push(self, h: int, t: float, d: int) -> None:
        if t == inf:
            heappush(self._never, (self.ctx.block_cost(d), -h, d))
        else:
            heappush(self._by_depth.setdefault(d, []), (-t, -h))
        self._entries += 1

    def on_pin(self, hashes) -> None:
        pop = self._rec.pop
        for h in hashes:
            pop(h, None)  # its heap entries are stale from now on

    def on_access(self, acc: Access) -> None:
        rec, hashes = self._rec, acc.hashes
        for i, t in _next_uses(acc):
            rec[hashes[i]] = (t, i)  # pinned now: enters a heap on release

    def on_release(self, hashes, now: float) -> None:
        rec = self._rec
        for h in hashes:
            r = rec.get(h)
            if r is not None:
                self._push(h, r[0], r[1])
        if self._entries > 2 * len(rec) + 1024:
            pinned = self.ctx.pinned  # a rebuild holds only what is evictable now
            self._never, self._by_depth, self._entries = [], {}, 0
            for h, (t, d) in rec.items():
                if h not in pinned:
                    self._push(h, t, d)

    def _top(self, heap: list, depth: int | None) -> tuple | None:
        """Clean the heap's top: drop stale entries; the valid top or None."""
        rec = self._rec
        while heap:
            entry = heap[0]
            if depth is None:  # the never-again heap
                h, key = -entry[1], (inf, entry[2])
            else:
                h, key = -entry[1], (-entry[0], depth)
            if rec.get(h) != key:
                heappop(heap)  # stale: accessed again since it was pushed (it returns on release)
            else:
                return entry
        return None

    def victims(self, need: int) -> list[int]:
        rec, by_depth, now = self._rec, self._by_depth, self.ctx.position
        out: list[int] = []
        tops: list | None = None  # this call's heap of depth-heap tops: (-score, -block, depth)

        def push_top(d: int) -> None:
            entry = self._top(by_depth[d], d)
            if entry is not None:
                # A next use at or before now cannot happen with positions; clamp all the same
                # so it would rank as the most urgent, never as a negative score.
                score = max(-entry[0] - now, 1e-9) / max(self.ctx.block_cost(d), 1e-300)
                assert tops is not None  # push_top runs once the tops are being ranked
                heappush(tops, (-score, entry[1], d))

        while len(out) < need:
            if self._top(self._never, None) is not None:
                h = -heappop(self._never)[1]
            else:
                if tops is None:  # scores are fixed during one call: rank the depth tops once
                    tops = []
                    for d in [d for d, heap in by_depth.items() if not heap]:
                        del by_depth[d]
                    for d in by_depth:
                        push_top(d)
                if not tops:
                    raise RuntimeError(f"{self.name}: asked for {need} victims, only {len(out)} evictable")
                d = heappop(tops)[2]
                h = -heappop(by_depth[d])[1]  # the entry push_top saw is still this heap's top
                push_top(d)
            del rec[h]
            out.append(h)
        return out

    def on_remove(self, h: int) -> None:
        self._rec.pop(h, None)
