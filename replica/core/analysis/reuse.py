"""LRU reuse distances per request, exact (Fenwick tree); the sampled tracker is in ``shards``.

Semantics (the block pool's LRU relies on them being exact): a request touches
blocks ``b_0..b_{n-1}`` (``b_0`` shallowest).  The distance of each ``b_i`` is its
position in the LRU stack at the *start* of the request (distinct blocks used more
recently).  The request's blocks then
move to the top with ``b_0`` most recent and ``b_{n-1}`` just below the others, as in
vLLM's free queue, where the deepest block of a freed request is evicted first.
A block-level LRU of capacity ``C >= n`` in ``holes`` mode then hits exactly the
accesses with distance ``< C``, so the histogram is the miss-ratio curve (Mattson).

``INF`` (2**63 - 1) stands for "no tracked previous access" (first access, or a block
already forgotten) and, with ``max_distance``, for any distance ``>= max_distance``.  It
is a large positive int rather than -1 so ``distance < capacity`` is the hit test for
every returned value.

Pure and synchronous; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from replica.core.analysis.lru_stack import INF

# Reuse-time buckets: bucket k holds [2**k, 2**(k+1)) seconds; shorter times fold into
# the first bucket, longer ones into the last.
RT_MIN_EXP, RT_MAX_EXP = -10, 30
_LOG2_BUCKETS = 64  # distances are < 2**63
_MASK64 = (1 << 64) - 1
_RANGE_MARK_MIN = 32  # requests longer than this mark their new timestamps as one range




def _as_list(hashes: Sequence[int] | np.ndarray) -> Sequence[int]:
    # numpy scalars hash like ints but make every dict probe ~10x slower.
    return hashes.tolist() if isinstance(hashes, np.ndarray) else hashes


def _log2_index(d: np.ndarray) -> np.ndarray:
    """Bucket 0 holds distance 0; bucket k+1 holds [2**k, 2**(k+1))."""
    # frexp is exact on integers below 2**53; larger finite distances cannot occur.
    return np.frexp(d.astype(np.float64))[1]


def _rt_index(dt: np.ndarray) -> np.ndarray:
    exp = np.frexp(np.maximum(dt, 0.0))[1] - 1  # floor(log2 dt) for dt > 0
    return np.clip(exp, RT_MIN_EXP, RT_MAX_EXP) - RT_MIN_EXP


def _log2_dict(zero: float, buckets: np.ndarray, inf: float) -> dict:
    return {"zero": zero, "inf": inf,
            "buckets": [[k, c] for k, c in enumerate(buckets.tolist()) if c]}


def _rt_list(hist: np.ndarray) -> list:
    return [[k + RT_MIN_EXP, c] for k, c in enumerate(hist.tolist()) if c]


def log_capacities(top: int, points: int = 32) -> list[int]:
    """~``points`` distinct integer capacities log-spaced over [1, top]."""
    top = max(int(top), 1)
    return sorted({int(round(c)) for c in np.geomspace(1, top, points)})


class _Fenwick:
    """Binary indexed tree over timestamps 1..size (a power of two); batched queries and updates.

    The per-request numpy calls cost about the same for 1 or 500 indices, so each walk
    over tree levels is unrolled into a (levels x n) array instead of a Python loop.
    """

    def __init__(self, size: int, marked: int) -> None:
        """A tree of ``size`` slots with timestamps 1..``marked`` marked."""
        assert size & (size - 1) == 0, "a power of two keeps every update node <= size"
        self.size = size
        self._sh = np.arange(size.bit_length(), dtype=np.int64)[:, None]
        i = np.arange(size + 1, dtype=np.int64)
        # Node i covers (i - lowbit(i), i]; with a marked prefix its count is closed-form.
        # int64 although int32 would fit: np.add.at with a casting dtype is ~2x slower.
        self.tree = np.minimum(i, marked) - np.minimum(i - (i & -i), marked)

    def prefix(self, idx: np.ndarray) -> np.ndarray:
        """Marked timestamps <= idx (idx 0 gives 0)."""
        hi = idx >> self._sh
        # The query walk visits idx with its low set bits cleared one at a time.
        nodes = (hi << self._sh) * (hi & 1)
        return self.tree[nodes].sum(axis=0)

    def add(self, idx: np.ndarray, delta: np.ndarray | int) -> None:
        # With j = idx - 1, the update walk is node ((j >> k) | 1) << k for every level k
        # where bit k of j is clear; other levels get a zero delta instead of a mask.
        x = (idx - 1) >> self._sh
        np.add.at(self.tree, (x | 1) << self._sh, ((x & 1) ^ 1) * delta)

    def add_range(self, a: int, b: int) -> None:
        """Mark every timestamp in [a, b]: O(b - a + levels) instead of O((b - a) * levels)."""
        i = np.arange(a, b + 1, dtype=np.int64)
        self.tree[a : b + 1] += i - np.maximum(i - (i & -i), a - 1)
        # Above b only b's own update walk covers any of [a, b], always a suffix of it;
        # that walk is short, and plain ints beat a dozen numpy calls on ~20 elements.
        nodes, counts, j = [], [], b
        while True:
            j += j & -j
            if j > self.size:
                break
            nodes.append(j)
            counts.append(b - max(j - (j & -j), a - 1))
        if nodes:
            self.tree[nodes] += counts


class ReuseDistanceTracker:
    """Exact per-request LRU stack distances with bounded memory when ``max_distance`` is set.

    With ``max_distance``, distances ``>= max_distance`` come back as ``INF`` and
    blocks deeper than it are eventually forgotten, so every capacity
    ``<= max_distance`` is still exact; larger capacities read as lower bounds.
    """

    def __init__(self, max_distance: int | None = None, *, initial_size: int = 1024) -> None:
        if max_distance is not None and max_distance < 1:
            raise ValueError(f"max_distance must be >= 1, got {max_distance}")
        self.max_distance = max_distance
        self._ts: dict[int, int] = {}  # block -> latest timestamp (1-based)
        self._fw = _Fenwick(1 << max(initial_size - 1, 15).bit_length(), 0)
        self._time: np.ndarray | None = None  # timestamp -> seconds; allocated on first `now`
        self._next = 1
        self._hist = np.zeros(max_distance or 1024, dtype=np.int64)
        self._rt_hist = np.zeros(RT_MAX_EXP - RT_MIN_EXP + 1, dtype=np.int64)
        self.accesses = 0
        self.cold = 0  # no tracked previous access (first touch, or forgotten)
        self.beyond = 0  # tracked, but at distance >= max_distance

    @property
    def tracked(self) -> int:
        return len(self._ts)

    def footprint(self) -> dict:
        """Sizes of the internal structures, for checking that memory stays bounded."""
        return {"tracked_blocks": len(self._ts), "timestamp_slots": self._fw.size,
                "histogram_bins": len(self._hist)}

    def access(self, hashes: Sequence[int], now: float | None = None) -> list[int]:
        """Distances of one request's blocks (``INF`` if untracked), then update the stack."""
        hashes = _as_list(hashes)
        if not len(hashes):
            return []
        dist, cold, dt = self._step(hashes, now)
        self._account(dist, cold, dt)
        return dist.tolist()

    record = access  # as ShardsTracker.record
    defer = access  # what the pool's metrics call: exact tracking has nothing to batch

    def _step(self, hashes: Sequence[int], now: float | None):
        """Core of ``access`` without accounting: (distances, cold mask, reuse times or None)."""
        n = len(hashes)
        if self._next + n > self._fw.size + 1:
            self._make_room(n)
        get = self._ts.get
        old = np.array([get(h, 0) for h in hashes], dtype=np.int64)
        live = len(self._ts)
        # All distances are read before any block of this request moves.
        dist = live - self._fw.prefix(old)
        cold = old == 0
        dist[cold] = INF
        if self.max_distance is not None and live > self.max_distance:
            dist[dist >= self.max_distance] = INF
        stale = old[~cold]
        dt = None
        if now is not None:
            if self._time is None:
                self._time = np.full(self._fw.size + 1, np.nan)
            dt = now - self._time[stale]
            dt = dt[~np.isnan(dt)]
        self._move_to_top(hashes, stale, now)
        return dist, cold, dt

    def _move_to_top(self, hashes: Sequence[int], stale: np.ndarray, now: float | None) -> None:
        uniq = dict.fromkeys(hashes)
        m = len(uniq)
        if m < len(hashes):  # a repeated block must be unmarked once
            hashes = list(uniq)
            stale = np.unique(stale)
        a = self._next
        if m > _RANGE_MARK_MIN:
            self._fw.add(stale, -1)
            self._fw.add_range(a, a + m - 1)
        else:  # one scattered update beats two calls on short requests
            idx = np.concatenate((stale, np.arange(a, a + m, dtype=np.int64)))
            delta = np.ones(idx.size, dtype=np.int64)
            delta[: stale.size] = -1
            self._fw.add(idx, delta)
        # b_0 gets the newest timestamp, so it ends on top of the stack.
        self._ts.update(zip(hashes, range(a + m - 1, a - 1, -1)))
        if now is not None and self._time is not None:
            self._time[a : a + m] = now
        self._next = a + m

    def _account(self, dist: np.ndarray, cold: np.ndarray, dt) -> None:
        n = dist.size
        finite = dist != INF
        k = int(np.count_nonzero(finite))
        n_cold = int(np.count_nonzero(cold))
        self.accesses += n
        self.cold += n_cold
        self.beyond += n - k - n_cold
        if k:
            # Distances are below the tracked count, so a histogram that long never overflows.
            if self.max_distance is None and len(self._ts) > len(self._hist):
                grown = np.zeros(2 * len(self._ts), dtype=np.int64)
                grown[: len(self._hist)] = self._hist
                self._hist = grown
            np.add.at(self._hist, dist if k == n else dist[finite], 1)
        if dt is not None and dt.size:
            np.add.at(self._rt_hist, _rt_index(dt), 1)

    def _make_room(self, n: int) -> None:
        """Renumber live timestamps to 1..k (oldest first), dropping blocks past max_distance."""
        live = len(self._ts)
        keep = live if self.max_distance is None else min(live, self.max_distance)
        size = self._fw.size
        if 2 * (keep + n) > size:  # keep half the slots free so renumbering stays amortized O(1)
            size = 1 << (2 * (keep + n) - 1).bit_length()
        blocks = list(self._ts)
        ts = np.fromiter(self._ts.values(), dtype=np.int64, count=live)
        order = np.argsort(ts, kind="stable")[live - keep :]
        if self._time is not None:
            time = np.full(size + 1, np.nan)
            time[1 : keep + 1] = self._time[ts[order]]
            self._time = time
        self._ts = dict(zip(map(blocks.__getitem__, order.tolist()), range(1, keep + 1)))
        self._fw = _Fenwick(size, keep)
        self._next = keep + 1

    def forget(self, hashes: Iterable[int]) -> int:
        """Stop tracking these blocks (their next access is cold); returns how many were tracked."""
        pop = self._ts.pop
        ts = [t for t in (pop(h, 0) for h in hashes) if t]
        if ts:
            idx = np.unique(np.array(ts, dtype=np.int64))
            self._fw.add(idx, np.full(idx.size, -1, dtype=np.int64))
        return len(ts)

    # ---- read-outs -------------------------------------------------------------------

    def histogram(self) -> np.ndarray:
        """Exact counts of finite distances: index d holds accesses at distance d."""
        return self._hist.copy()

    def hit_ratio_at(self, capacity: int) -> float:
        """Block hit ratio of an LRU of ``capacity`` blocks: accesses with distance < capacity."""
        if self.accesses == 0 or capacity <= 0:
            return 0.0
        return float(self._hist[: int(capacity)].sum()) / self.accesses

    def miss_ratio_curve(self, capacities: Iterable[int] | None = None) -> list[tuple[int, float]]:
        """``(capacity, hit_ratio)`` pairs (hit ratio = 1 - miss ratio)."""
        cum = np.concatenate(([0], np.cumsum(self._hist)))
        if capacities is None:
            capacities = log_capacities(self._mrc_top())
        total = max(self.accesses, 1)
        return [(int(c), float(cum[min(max(int(c), 0), len(cum) - 1)]) / total)
                for c in capacities]

    def _mrc_top(self) -> int:
        if self.max_distance is not None:
            return self.max_distance
        nz = np.flatnonzero(self._hist)
        return int(nz[-1]) + 1 if nz.size else 1

    def log2_histogram(self) -> dict:
        """``zero``: distance 0; ``buckets``: [k, count] for [2**k, 2**(k+1)); ``inf``."""
        h = self._hist
        buckets = np.bincount(_log2_index(np.arange(1, len(h))) - 1, weights=h[1:],
                              minlength=_LOG2_BUCKETS).astype(np.int64)
        return _log2_dict(int(h[0]) if len(h) else 0, buckets, self.cold + self.beyond)

    def to_dict(self) -> dict:
        return {
            "kind": "exact",
            "accesses": self.accesses,
            "cold": self.cold,
            "beyond": self.beyond,
            "max_distance": self.max_distance,
            "distance_log2": self.log2_histogram(),
            "reuse_time_log2_s": _rt_list(self._rt_hist),
            "mrc": [[c, h] for c, h in self.miss_ratio_curve()],
            **self.footprint(),
        }
