"""S3-FIFO (Yang et al., SOSP'23) with the semantics of libCacheSim's ``S3FIFO.c``.

Three FIFOs: small (``small_ratio`` of the pool, at least one block), main (the rest) and a
ghost of ids only (``ghost_ratio`` of the pool; by default as large as main). Each resident
block has a frequency counter, set to 0 on insertion and incremented on every hit, capped
at 3 (2 bits).

* Insertion: an id found in ghost leaves it and enters main; otherwise the block enters
  small -- except that before the first eviction ever, once small is full, new blocks go
  to main (libCacheSim's ``has_evicted`` rule; it only shapes the warm-up).
* Eviction, one block at a time: from main if main is over its size or small is empty,
  else from small. Small: the block at its eviction end (the oldest) moves to main's insertion
  end with its counter reset to 0 when ``freq >= move_to_main_threshold`` (libCacheSim compares
  with ``>=``; its default is 2, i.e. at least two hits while in small), otherwise it is evicted
  and its id enters the ghost's insertion end (the ghost drops from its eviction end when full);
  repeat until one block is evicted. Main: the block at its eviction end with ``freq > 0`` is
  reinserted at the insertion end with ``freq - 1``; one with ``freq == 0`` is evicted.

Each queue has an eviction end (the oldest, next out: a deque's left) and an insertion end (its
right); ``_pool.c`` names its lists' ends the same way (libCacheSim calls them tail and head).

Adaptations to the pool's protocol: the pool asks ``victims(k)`` before it inserts a
request's new blocks, so k evictions happen back to back, then the insertions. Blocks
of one request are inserted deepest first (the shallow, most shareable blocks end up
newest, as in lru.py). A block the policy evicts while it is pinned (in use) stays resident
(the pool skips it) and comes back through ``on_release`` when its request ends; it re-enters
as an insertion does: from the ghost (where an eviction from small put it) into main.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from replica.core.cache.policies.base import Access, EvictionPolicy, PolicyContext
from shared.errors import InputError
from shared.validate import check_int, check_number

MAX_FREQ = 3
IN_MAIN = 4  # flag bit stored with the counter: the block sits in main


class S3FIFOPolicy(EvictionPolicy):
    name = "s3fifo"
    _freq: dict[int, int]
    _small: deque[int]
    _main: deque[int]
    _ghost: OrderedDict[int, None]

    def __init__(self, small_ratio: float = 0.1, move_to_main_threshold: int = 2,
                 ghost_ratio: float | None = None, **params) -> None:
        super().__init__(**params)
        check_number("small_ratio", small_ratio, above=0, maximum=1)
        if small_ratio >= 1:
            raise InputError("small_ratio", f"must be a number in (0, 1), got {small_ratio!r}")
        check_int("move_to_main_threshold", move_to_main_threshold, 1, MAX_FREQ)
        if ghost_ratio is not None:
            check_number("ghost_ratio", ghost_ratio, minimum=0)
        self.small_ratio = float(small_ratio)
        self.threshold = move_to_main_threshold
        self.ghost_ratio = ghost_ratio
        self.clear()

    def bind(self, ctx: PolicyContext) -> None:
        super().bind(ctx)
        cap = ctx.capacity
        self.small_size = min(cap, max(1, int(cap * self.small_ratio)))
        self.main_size = cap - self.small_size
        self.ghost_size = self.main_size if self.ghost_ratio is None else int(cap * self.ghost_ratio)

    def on_access(self, acc: Access) -> None:
        if self._dirty:
            self._purge()
        hashes = acc.hashes
        fr = self._freq
        for i in acc.touched_idx:
            h = hashes[i]
            f = fr.get(h)
            if f is not None and f & MAX_FREQ != MAX_FREQ:
                fr[h] = f + 1
        if acc.new_idx:
            self._insert([hashes[i] for i in reversed(acc.new_idx)])  # deepest first: evicted first

    def on_release(self, hashes, now: float) -> None:
        fr = self._freq
        if not all(map(fr.__contains__, hashes)):  # blocks given up as victims while pinned
            self._insert([h for h in reversed(hashes) if h not in fr])

    def _insert(self, blocks: list[int]) -> None:
        fr, ghost, small, main = self._freq, self._ghost, self._small, self._main
        if self._evicted:
            for h in blocks:
                if h in ghost:
                    del ghost[h]
                    fr[h] = IN_MAIN
                    main.append(h)
                else:
                    fr[h] = 0
                    small.append(h)
            return
        small_size = self.small_size
        for h in blocks:  # warm-up, ghost empty: once small is full, to main
            if len(small) < small_size:
                fr[h] = 0
                small.append(h)
            else:
                fr[h] = IN_MAIN
                main.append(h)

    def victims(self, need: int) -> list[int]:
        if self._dirty:
            self._purge()
        self._evicted = True
        out: list[int] = []
        while len(out) < need:
            if len(self._main) > self.main_size or not self._small:
                out.append(self._evict_main())
            else:
                self._evict_small(out, need)
        return out

    def _evict_main(self) -> int:
        """Main is a clock with a 2-bit counter: reinsert while the counter is above 0."""
        fr, main = self._freq, self._main
        pop, push = main.popleft, main.append
        while True:
            h = pop()
            f = fr[h]
            if f == IN_MAIN:
                del fr[h]
                return h
            fr[h] = f - 1
            push(h)

    def _evict_small(self, out: list[int], need: int) -> None:
        """Small: promote or evict; stay here while main is within its size."""
        fr, small, main, ghost = self._freq, self._small, self._main, self._ghost
        thr, main_size, ghost_size = self.threshold, self.main_size, self.ghost_size
        while small and len(out) < need:
            h = small.popleft()
            if fr[h] >= thr:
                fr[h] = IN_MAIN
                main.append(h)
                continue
            del fr[h]
            out.append(h)
            if ghost_size:
                ghost[h] = None
                if len(ghost) > ghost_size:
                    ghost.popitem(False)
            if len(main) > main_size:
                return

    def on_remove(self, h: int) -> None:
        # O(1): forget the counter now, drop the queue entry at the next purge.
        if self._freq.pop(h, None) is not None:
            self._dirty = True

    def _purge(self) -> None:
        fr = self._freq
        self._small = deque(h for h in self._small if h in fr)
        self._main = deque(h for h in self._main if h in fr)
        self._dirty = False

    def clear(self) -> None:
        # A block's counter and queue: freq (0..3) | IN_MAIN. Queues: left = the eviction end (next out).
        self._freq = {}
        self._small = deque()
        self._main = deque()
        self._ghost = OrderedDict()  # ids only; first = oldest
        self._dirty = False  # on_remove left entries in a queue
        self._evicted = False

    def describe(self) -> dict:
        d = {"name": self.name, "small_ratio": self.small_ratio,
             "move_to_main_threshold": self.threshold, "ghost_ratio": self.ghost_ratio}
        if hasattr(self, "ctx"):
            d.update(small_size=self.small_size, main_size=self.main_size, ghost_size=self.ghost_size)
            if self.ghost_ratio is None:
                d["ghost_ratio"] = self.ghost_size / self.ctx.capacity
        return d
