"""Offline oracles (simulator only, ``needs_future = True``): Belady and BeladyCompute.

The simulator passes ``Access.next_use[i]``: the time of block i's next access after this
request (``inf`` when never again). A missing ``next_use`` counts as ``inf``. Each policy
keeps, per known block, its latest next use; heaps hold (key, block) entries and are
cleaned lazily: an entry is stale when the block's current record differs from it.
Heaps are rebuilt when stale entries outnumber live ones. Pinned entries met while
looking for victims are set aside and pushed back afterwards.

* Belady: evict the farthest next use (``inf`` first); ties: larger block hash first.
  With equal-size blocks and holes-mode hits this minimises misses.
* BeladyCompute (seed 002): evict the largest ``(next_use - now) / cost(depth)``, ``cost``
  the pool's recompute cost at the block's depth (its index in the request). Blocks never
  used again come first (score ``inf``), the cheapest of them first. Exact: for a fixed
  depth the cost is fixed, so within one depth the order by score is the order by next
  use at every ``now``; one max-heap per depth holds the finite blocks. A ``victims``
  call (one ``now``) scores the valid top of every depth heap once, keeps those scores
  in a heap, and after each eviction re-scores only the depth it came from: the exact
  argmax over all resident unpinned blocks, in O(depths + need · log) per call. ``now`` is the latest request time the policy has seen
  (the pool calls ``victims`` before ``on_access`` of the request that needs space).
  Ties: larger block hash first.
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

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self._nu: dict[int, float] = {}  # block -> next use
        self._heap: list[tuple[float, int]] = []  # (-next use, -block): a max-heap

    def on_access(self, acc: Access) -> None:
        nu, heap, hashes = self._nu, self._heap, acc.hashes
        for i, t in _next_uses(acc):
            h = hashes[i]
            nu[h] = t
            heappush(heap, (-t, -h))
        if len(heap) > 2 * len(nu) + 1024:
            self._heap = [(-t, -h) for h, t in nu.items()]
            heapify(self._heap)

    def victims(self, need: int) -> list[int]:
        nu, heap, pinned = self._nu, self._heap, self.ctx.pinned
        out: list[int] = []
        held = []
        while len(out) < need:
            if not heap:
                raise RuntimeError(f"{self.name}: asked for {need} victims, only {len(out)} evictable")
            entry = heappop(heap)
            h = -entry[1]
            if nu.get(h) != -entry[0]:
                continue  # stale
            if h in pinned:
                held.append(entry)
                continue
            del nu[h]
            out.append(h)
        for entry in held:
            heappush(heap, entry)
        return out

    def on_remove(self, h: int) -> None:
        self._nu.pop(h, None)


class BeladyComputePolicy(EvictionPolicy):
    name = "belady_compute"
    needs_future = True

    def __init__(self) -> None:
        self._now = 0.0
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

    def on_access(self, acc: Access) -> None:
        if acc.now > self._now:
            self._now = acc.now
        rec, hashes = self._rec, acc.hashes
        for i, t in _next_uses(acc):
            h = hashes[i]
            rec[h] = (t, i)
            self._push(h, t, i)
        if self._entries > 2 * len(rec) + 1024:
            self._never, self._by_depth, self._entries = [], {}, 0
            for h, (t, d) in rec.items():
                self._push(h, t, d)

    def on_release(self, hashes, now: float) -> None:
        if now > self._now:
            self._now = now

    def _top(self, heap: list, depth: int | None, pinned, held: list) -> tuple | None:
        """Clean the heap's top: drop stale entries, set pinned ones aside; the valid top or None."""
        rec = self._rec
        while heap:
            entry = heap[0]
            if depth is None:  # the never-again heap
                h, key = -entry[1], (inf, entry[2])
            else:
                h, key = -entry[1], (-entry[0], depth)
            if rec.get(h) != key:
                heappop(heap)
            elif h in pinned:
                held.append((depth, heappop(heap)))
            else:
                return entry
        return None

    def victims(self, need: int) -> list[int]:
        if self.ctx.now > self._now:  # score at the incoming request's time
            self._now = self.ctx.now
        rec, pinned, by_depth, now = self._rec, self.ctx.pinned, self._by_depth, self._now
        out: list[int] = []
        held: list = []
        tops: list | None = None  # this call's heap of depth-heap tops: (-score, -block, depth)

        def push_top(d: int) -> None:
            entry = self._top(by_depth[d], d, pinned, held)
            if entry is not None:
                # A next use already past (the replica is behind its arrivals) means "needed
                # now": clamp so it ranks as the most urgent, never as a negative score.
                score = max(-entry[0] - now, 1e-9) / max(self.ctx.block_cost(d), 1e-300)
                assert tops is not None  # push_top runs once the tops are being ranked
                heappush(tops, (-score, entry[1], d))

        while len(out) < need:
            if self._top(self._never, None, pinned, held) is not None:
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
        for d, entry in held:
            heappush(self._never if d is None else by_depth.setdefault(d, []), entry)
        return out

    def on_remove(self, h: int) -> None:
        self._rec.pop(h, None)
