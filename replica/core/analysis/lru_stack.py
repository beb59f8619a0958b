"""A pure-Python exact LRU stack for requests of a few blocks: SHARDS's inner tracker.

Same semantics as ``reuse.ReuseDistanceTracker`` without ``max_distance``: every distance of
a request is read at its start, then its blocks move to the top with ``b_0`` most recent.
A sampled request carries a handful of blocks (about 3 of 24 at rate 0.1), where the ~20
numpy calls per request of the batched tracker cost several times the work itself, so the
structures here are plain lists and dicts.

Every block access takes the next timestamp, so every timestamp below ``_next`` is either
some block's latest one (live) or dead (superseded, or forgotten). The distance of a block
last seen at ``t`` is the number of live timestamps after ``t``: all of them, less the dead
ones. A Fenwick tree counts only the dead, so marking a new timestamp costs nothing, and
when no timestamp has died since the last renumbering a distance is one subtraction.

``make_lru_stack`` returns the compiled twin (``_lru_stack.c``, the same state and answers) where
it is built, this class otherwise. Blocks are keyed mod 2^64.

Pure and synchronous; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from shared.native import load

INF = (1 << 63) - 1
_MASK64 = (1 << 64) - 1  # blocks are keyed mod 2^64, as the compiled stack keys them


class LruStack:
    def __init__(self, initial_size: int = 1024) -> None:
        self.size = 1 << max(initial_size - 1, 15).bit_length()  # a power of two, as reuse._Fenwick
        self._dead = [0] * (self.size + 1)  # Fenwick tree over dead timestamps
        self._ndead = 0
        self._ts: dict[int, int] = {}  # block -> latest timestamp (1-based)
        self._time: list[float | None] | None = None  # timestamp -> seconds; allocated on first `now`
        self._next = 1

    @property
    def tracked(self) -> int:
        return len(self._ts)

    def step(self, blocks: Sequence[int], now: float | None) -> tuple[list[int], list[float]]:
        """Distances of ``blocks`` (``INF`` if untracked) and the reuse times of the tracked ones
        whose previous access had a time, in order; then the blocks move to the top."""
        n = len(blocks)
        if self._next + n > self.size + 1:
            self._make_room(n)
        blocks = [b & _MASK64 for b in blocks]
        get, dead, size = self._ts.get, self._dead, self.size
        a = self._next
        olds = [get(b, 0) for b in blocks]
        dists = []
        stale = []
        # Live timestamps after t: (a - 1 - t) allocated, less the dead among them.
        after = a - 1 - self._ndead
        for t in olds:
            if t:
                s, i = after - t, t
                while i:
                    s += dead[i]
                    i &= i - 1
                dists.append(s)
                stale.append(t)
            else:
                dists.append(INF)
        dts: list[float] = []
        if now is not None:
            if self._time is None:
                self._time = [None] * (size + 1)
            time = self._time
            dts = [now - x for x in (time[t] for t in stale) if x is not None]
        uniq = dict.fromkeys(blocks)
        m = len(uniq)
        if m < n:  # a repeated block dies once
            stale = list(set(stale))
        for i in stale:
            while i <= size:
                dead[i] += 1
                i += i & -i
        self._ndead += len(stale)
        # b_0 gets the newest timestamp, so it ends on top of the stack.
        self._ts.update(zip(uniq, range(a + m - 1, a - 1, -1)))
        if now is not None:
            self._time[a : a + m] = [now] * m  # type: ignore[index]  # allocated above
        self._next = a + m
        return dists, dts

    def step_many(self, blocks: np.ndarray, offsets: np.ndarray, times: np.ndarray | None,
                  dists: np.ndarray, dts: np.ndarray) -> int:
        """``step`` each request ``blocks[offsets[k]:offsets[k+1]]`` (at ``times[k]``; no times: None)
        in order, writing their distances into ``dists`` (aligned with ``blocks``) and their reuse
        times, in order, into ``dts``; returns how many reuse times were written."""
        blocks_list, bounds = blocks.tolist(), offsets.tolist()
        when = times.tolist() if times is not None else None
        written = 0
        for k in range(len(bounds) - 1):
            lo, hi = bounds[k], bounds[k + 1]
            if lo == hi:
                continue
            d, t = self.step(blocks_list[lo:hi], when[k] if when is not None else None)
            dists[lo:hi] = d
            dts[written:written + len(t)] = t
            written += len(t)
        return written

    def _make_room(self, n: int) -> None:
        """Renumber live timestamps to 1..k (oldest first), none dead; grow so half the slots stay free."""
        live = len(self._ts)
        size = self.size
        if 2 * (live + n) > size:
            size = 1 << (2 * (live + n) - 1).bit_length()
        order = sorted(self._ts.items(), key=lambda kv: kv[1])
        if self._time is not None:
            old = self._time
            self._time = [None, *(old[t] for _, t in order)] + [None] * (size - live)
        self._ts = {b: k for k, (b, _) in enumerate(order, 1)}
        self.size = size
        self._dead = [0] * (size + 1)
        self._ndead = 0
        self._next = live + 1

    def forget(self, blocks: Iterable[int]) -> int:
        """Stop tracking these blocks (their next access is cold); returns how many were tracked."""
        pop, dead, size = self._ts.pop, self._dead, self.size
        gone = {t for t in (pop(b & _MASK64, 0) for b in blocks) if t}
        for i in gone:
            while i <= size:
                dead[i] += 1
                i += i & -i
        self._ndead += len(gone)
        return len(gone)


_compiled, _ = load("replica.core.compiled._lru_stack")


def make_lru_stack() -> LruStack:
    """The compiled stack where it is built, else the Python one (the same answers)."""
    return _compiled.LruStack() if _compiled is not None else LruStack()  # type: ignore[no-any-return]
