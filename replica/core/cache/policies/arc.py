"""ARC, Adaptive Replacement Cache (Megiddo & Modha, FAST'03), on KV blocks.

T1 (blocks seen once recently) and T2 (seen at least twice) hold resident blocks, B1 and
B2 the ids of blocks evicted from them; all four are LRU lists (first = LRU end). The
target size ``p`` of T1 adapts: a miss whose id is in B1 means T1 was too small
(``p += max(|B2|/|B1|, 1)``, capped at c), one in B2 means T2 was (``p -= max(|B1|/|B2|, 1)``,
floored at 0). c is the pool capacity.

The pool splits ARC's single step into two: ``victims(k)`` runs before the request's new
blocks are known, ``on_access`` after they are inserted. So:

* ``victims(k)`` is ARC's REPLACE applied k times: evict T1's LRU block into B1 when
  ``|T1| > p`` (or T2 has nothing evictable), else T2's LRU block into B2. The paper's tie
  rule (``|T1| == p`` and the request is a B2 hit -> T1) is dropped: the request is unknown.
* ``on_access`` does the case analysis. A hit (T1 or T2) moves to T2's MRU end. A new block
  in B1 or B2 adapts ``p``, leaves the ghost and enters T2's MRU end; any other new block
  enters T1's MRU end, after which the ghosts are trimmed from their LRU ends so that
  ``|T1| + |B1| <= c`` (B1 first) and ``|T1| + |T2| + |B1| + |B2| <= 2c`` (B2 first).
  This equals the paper's case IV (including "|T1| = c: drop T1's LRU block without a
  ghost": it is evicted into B1 and trimmed at once). The adaptation therefore steers the
  evictions made for the next request, not for the one that caused it (a one-request lag).
* A request's blocks are processed deepest first, so its shallow (most shared) blocks end
  most recent, as in lru.py. A block evicted while pinned stays resident (the pool skips
  it) and returns through ``on_release`` when its request ends: it leaves the ghost that
  the eviction put it in and enters T2's MRU end (it was used again), without adapting ``p``.
"""

from __future__ import annotations

from collections import OrderedDict

from replica.core.cache.policies.base import Access, EvictionPolicy


class ARCPolicy(EvictionPolicy):
    name = "arc"
    p: float  # target size of T1, adapted on ghost hits

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.clear()

    def on_access(self, acc: Access) -> None:
        hashes = acc.hashes
        t1, t2, b1, b2 = self._t1, self._t2, self._b1, self._b2
        for i in reversed(acc.touched_idx):
            h = hashes[i]
            if h in t1:
                del t1[h]
                t2[h] = None
            elif h in t2:
                t2.move_to_end(h)
        if not acc.new_idx:
            return
        c = self.ctx.capacity
        for i in reversed(acc.new_idx):
            h = hashes[i]
            if h in b1:
                self.p = min(float(c), self.p + max(len(b2) / len(b1), 1.0))
                del b1[h]
                t2[h] = None
            elif h in b2:
                self.p = max(0.0, self.p - max(len(b1) / len(b2), 1.0))
                del b2[h]
                t2[h] = None
            elif h not in t2:
                t1[h] = None
                if len(t1) + len(b1) > c and b1:
                    b1.popitem(last=False)
                if len(t1) + len(t2) + len(b1) + len(b2) > 2 * c:
                    (b2 or b1).popitem(last=False)

    def on_release(self, hashes, now: float) -> None:
        t1, t2 = self._t1, self._t2
        for h in reversed(hashes):
            if h not in t1 and h not in t2:  # given up as a victim while pinned
                self._b1.pop(h, None)
                self._b2.pop(h, None)
                t2[h] = None

    def victims(self, need: int) -> list[int]:
        t1, t2, b1, b2 = self._t1, self._t2, self._b1, self._b2
        out: list[int] = []
        while len(out) < need:
            if t1 and (len(t1) > self.p or not t2):
                h = t1.popitem(last=False)[0]
                b1[h] = None
            else:
                h = t2.popitem(last=False)[0]
                b2[h] = None
            out.append(h)
        return out

    def on_remove(self, h: int) -> None:
        if h in self._t1:
            del self._t1[h]
        else:
            self._t2.pop(h, None)

    def clear(self) -> None:
        self._t1: OrderedDict[int, None] = OrderedDict()
        self._t2: OrderedDict[int, None] = OrderedDict()
        self._b1: OrderedDict[int, None] = OrderedDict()
        self._b2: OrderedDict[int, None] = OrderedDict()
        self.p = 0.0

    def describe(self) -> dict:
        return {"name": self.name, "p": round(self.p, 3)}  # p: the current target size of T1
