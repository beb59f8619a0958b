"""SHARDS: LRU reuse distances over a hash-sampled subset of blocks (the default tracker).

Same semantics as ``reuse.ReuseDistanceTracker`` (see there), at a fraction of the cost. The
pool's metrics call ``defer``: requests queue up and their blocks' sampling hashes are computed
with numpy for many requests at once (a Python hash per block cost as much as everything else
together); every read-out drains the queue first, so what it reports is the same as ``record``
one request at a time would give.

Pure and synchronous; no I/O.
"""

from __future__ import annotations

import heapq
import struct
from array import array
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Protocol

import numpy as np
import xxhash

from replica.core.analysis.lru_stack import INF, make_lru_stack
from replica.core.analysis.reuse import (
    _LOG2_BUCKETS,
    _MASK64,
    RT_MAX_EXP,
    RT_MIN_EXP,
    _as_list,
    _log2_dict,
    _log2_index,
    _rt_index,
    _rt_list,
    log_capacities,
)
from shared.hashing import XXH3_PRIME_U64, xxh3_flip, xxh3_u64

_PACK_U64 = struct.Struct("<Q").pack
_xxh3 = xxhash.xxh3_64_intdigest
_VECTOR_MIN = 48  # requests at least this long are sampled with numpy, shorter ones in Python
_DRAIN_AT = 1 << 15  # deferred block accesses that trigger a drain


class BlockSampler(Protocol):
    """What samples a pool's recorded blocks for the tracker where their keys are (the compiled pool)."""

    def sample(self, flip: int, prime: int, modulus: int, threshold: int) -> None:
        """Keep, of each recorded request from now on, the blocks whose ``xxh3_u64`` value (its seed
        given as ``xxh3_flip``, and the prime) modulo ``modulus`` is below ``threshold``."""

    def take_samples(self) -> tuple[bytes, bytes, bytes]:
        """The kept blocks (u64) and values (u64) since the last take, and per recorded request the
        count kept up to its end (i64)."""
        ...


class ShardsTracker:
    """SHARDS (Waldspurger et al., FAST'15): exact stack distances over a hash-sampled subset.

    A block is sampled iff ``xxh3_64(block, seed) mod P < T`` (rate ``R = T / P``), so a
    block is always in or always out and its reuses are all seen.  Each sampled access
    stands for ``1/R`` accesses at distance ``d/R``.  Fixed-size variant: when more than
    ``max_tracked`` blocks are tracked, ``T`` drops to the largest tracked hash and those
    blocks are forgotten.  Rather than rescaling the histogram by ``R_new/R_old`` on each
    drop, every sample is weighted ``1/R`` of its own time, which is the same estimate.

    Block ids are rehashed with ``seed`` so consecutive ids (Mooncake) and ids a router
    already shards on are still sampled uniformly.

    ``adjust`` (SHARDS_adj): the weighted sample count should equal the true access count;
    the difference, mostly from heavy-hitter blocks falling in or out of the sample, is
    added to the distance-0 bucket (a hit at every capacity).  It is the default because
    one sampled hot block (a chat-template block in every request) otherwise swamps the
    estimate; on traces without such a block the plain ratio (``adjust=False``) is about
    twice as tight (see tests/replica/core/analysis/test_reuse.py for measured errors).
    """

    P = 1 << 24
    # Bin edges over integer scaled distance: width 1 up to ~184, then ~0.5% wide (128 per
    # octave), so the MRC is exact at small capacities, with ~7K bins in all.  Powers of two
    # are edges too, so the log2 histogram is a sum of whole bins.
    _EDGES = np.union1d(np.floor(np.exp2(np.arange(62 * 128) / 128)).astype(np.int64) - 1,
                        np.int64(1) << np.arange(62, dtype=np.int64))

    def __init__(self, rate: float = 0.01, max_tracked: int = 1 << 16, seed: int = 0,
                 *, adjust: bool = True) -> None:
        if not 0 < rate <= 1:
            raise ValueError(f"rate must be in (0, 1], got {rate}")
        if max_tracked < 1:
            raise ValueError(f"max_tracked must be >= 1, got {max_tracked}")
        self.threshold = max(1, round(rate * self.P))
        self.max_tracked = max_tracked
        self.seed = seed & _MASK64
        self.adjust = adjust
        self._inner = make_lru_stack()
        self._heap: list[tuple[int, int]] = []  # (-sample hash, block) of tracked blocks
        self._hist = np.zeros(len(self._EDGES))  # weighted counts per scaled-distance bin
        self._rt_hist = np.zeros(RT_MAX_EXP - RT_MIN_EXP + 1)
        # Distances and reuse times not yet in the histograms, all sampled at weight _pend_w, in
        # chunks as they came (arrays from a bulk step, lists from one request's): accounted in bulk,
        # in order (numpy per access costs more than the access; a round trip through lists too).
        self._pend_d: list[Sequence[int] | np.ndarray] = []
        self._pend_t: list[Sequence[float] | np.ndarray] = []
        self._pend_n = 0  # distances in _pend_d
        self._pend_w = 0.0
        self.accesses = 0  # every access offered, sampled or not
        self.sampled = 0
        self._w_total = 0.0  # sum of 1/R over sampled accesses: estimates `accesses`
        self._w_cold = 0.0
        self._deferred: list[tuple[Sequence[int], float | None]] = []  # requests not yet accounted
        self._deferred_blocks = 0
        # ... or, with a sampler (sample_in), their lengths and times; the sampler holds their samples
        self._counted: list[tuple[int, float | None]] = []
        self._sampler: BlockSampler | None = None
        self._sampler_threshold = self.threshold

    @property
    def rate(self) -> float:
        return self.threshold / self.P

    @property
    def tracked(self) -> int:
        self._drain()
        return self._inner.tracked

    def footprint(self) -> dict:
        self._drain()
        return {"tracked_blocks": self._inner.tracked, "heap": len(self._heap),
                "timestamp_slots": self._inner.size, "histogram_bins": len(self._hist)}

    def sample_hash(self, block: int) -> int:
        """The value compared with ``threshold``: the block is sampled iff it is lower."""
        return _xxh3(_PACK_U64(block & _MASK64), self.seed) % self.P

    def access(self, hashes: Sequence[int], now: float | None = None) -> list[int]:
        """Scaled distances (``floor(d/R)``, or ``INF``) of the sampled blocks only, in order."""
        w = self.P / self.threshold
        dist = self.record(hashes, now)
        # floor keeps the hit test exact: floor(d/R) < C iff d/R < C for integer C.
        return [d if d == INF else int(d * w // 1) for d in dist]

    def defer(self, hashes: Sequence[int], now: float | None = None) -> None:
        """``record`` later, with many requests' sampling hashes computed at once; read-outs drain first."""
        if self._counted:  # what a sampler kept comes first
            self._drain()
        self._deferred.append((_as_list(hashes), now))
        self._deferred_blocks += len(hashes)
        if self._deferred_blocks >= _DRAIN_AT:
            self._drain()

    def sample_in(self, sampler: BlockSampler) -> None:
        """From now on ``sampler`` (the compiled pool) applies this tracker's sampling rule to what it
        records, and the pool calls ``defer_sampled`` instead of ``defer``: the blocks are hashed where
        their keys already are, and only the sampled ones come back."""
        self._drain()
        self._sampler = sampler
        self._tell(sampler)

    def defer_sampled(self, blocks: int, now: float | None = None) -> None:
        """``defer`` of a request of ``blocks`` blocks whose sample ``sample_in``'s sampler kept."""
        if self._deferred:  # what was deferred before it comes first
            self._drain()
        self._counted.append((blocks, now))
        self._deferred_blocks += blocks
        if self._deferred_blocks >= _DRAIN_AT:
            self._drain()

    def _tell(self, sampler: BlockSampler) -> None:
        sampler.sample(xxh3_flip(self.seed), XXH3_PRIME_U64, self.P, self.threshold)
        self._sampler_threshold = self.threshold

    def _drain(self) -> None:
        """Account the deferred requests in order, exactly as ``record`` one at a time would."""
        if self._counted:
            self._drain_sampled()
        if not self._deferred:
            return
        queue, self._deferred, self._deferred_blocks = self._deferred, [], 0
        try:  # array("Q") fills in C what a list and then numpy took two passes for
            flat = array("Q", chain.from_iterable(h for h, _ in queue))
        except (OverflowError, TypeError):  # a negative or too-wide id: one request at a time masks it
            for hashes, now in queue:
                self._account(len(hashes), self._picked(hashes), now)
            return
        blocks = np.frombuffer(flat, dtype=np.uint64)
        sample = xxh3_u64(blocks, self.seed) % np.uint64(self.P)
        keep = np.flatnonzero(sample < np.uint64(self.threshold))
        lengths = [len(h) for h, _ in queue]
        self._account_sampled(lengths, [now for _, now in queue], blocks[keep], sample[keep],
                              np.searchsorted(keep, np.cumsum(lengths)))

    def _drain_sampled(self) -> None:
        """``_drain`` of what the sampler kept: the same blocks ``_drain`` would have picked."""
        assert self._sampler is not None  # only a sampler's pool calls defer_sampled
        queue, self._counted, self._deferred_blocks = self._counted, [], 0
        keys, values, ends = self._sampler.take_samples()
        picked = np.frombuffer(keys, dtype=np.uint64)
        sample = np.frombuffer(values, dtype=np.uint64)
        cuts = np.frombuffer(ends, dtype=np.int64)
        if len(cuts) != len(queue):
            raise RuntimeError(f"the sampler kept {len(cuts)} requests, {len(queue)} were deferred")
        if self._sampler_threshold != self.threshold:  # lowered since the sampler was told (record)
            keep = np.flatnonzero(sample < np.uint64(self.threshold))
            picked, sample, cuts = picked[keep], sample[keep], np.searchsorted(keep, cuts)
        self._account_sampled([n for n, _ in queue], [now for _, now in queue], picked, sample, cuts)
        if self._sampler_threshold != self.threshold:  # a shrink lowered it: the sampler keeps fewer from here on
            self._tell(self._sampler)

    def _account_sampled(self, lengths: list[int], times: list[float | None], picked: np.ndarray,
                         sample: np.ndarray, cuts: np.ndarray) -> None:
        """Account requests of ``lengths`` blocks at ``times`` whose sampled blocks (at the current
        threshold) are ``picked`` (their sample hashes ``sample``), request i's ending at ``cuts[i]``."""
        if self._inner.tracked + len(picked) <= self.max_tracked:  # no shrink can happen: one call for all
            self._account_many(lengths, times, picked, sample, cuts)
            return
        t = self.threshold
        start = 0
        for n, now, stop in zip(lengths, times, cuts.tolist()):
            if self.threshold != t:  # a shrink lowered it since: fewer blocks are sampled from here on
                idx = [i for i in range(start, stop) if int(sample[i]) < self.threshold]
                self._account(n, [int(picked[i]) for i in idx], now)
            else:
                self._account(n, picked[start:stop].tolist(), now)
            start = stop

    def record(self, hashes: Sequence[int], now: float | None = None) -> list[int]:
        """Account one request; the unscaled distances of its sampled blocks (``INF`` if cold)."""
        self._drain()
        hashes = _as_list(hashes)
        return self._account(len(hashes), self._picked(hashes), now)

    def _account(self, blocks: int, picked: list[int], now: float | None) -> list[int]:
        self.accesses += blocks
        if not picked:
            return []
        dist, dts = self._inner.step(picked, now)
        w = self.P / self.threshold  # 1/R at the time of this access
        if w != self._pend_w:
            self._flush()
            self._pend_w = w
        n, n_cold = len(dist), dist.count(INF)  # the inner stack never forgets on its own: INF is cold
        self.sampled += n
        self._w_total += w * n
        self._w_cold += w * n_cold
        self._pend_d.append(dist)
        self._pend_t.append(dts)
        self._pend_n += n
        if n_cold:
            for h, d in zip(picked, dist):
                if d == INF:
                    heapq.heappush(self._heap, (-self.sample_hash(h), h))
        if self._pend_n > 1 << 16:
            self._flush()
        if self._inner.tracked > self.max_tracked:
            self._shrink()
        return dist

    def _account_many(self, lengths: list[int], timed: list[float | None], picked: np.ndarray, hashes: np.ndarray,
                      cuts: np.ndarray) -> None:
        """``_account`` every deferred request at once (no shrink can happen: the threshold, and so
        the weight, stay): requests of ``lengths`` blocks at ``timed``, ``picked`` their sampled blocks,
        ``hashes`` the blocks' sample hashes, ``picked[cuts[i-1]:cuts[i]]`` request i's. The sums run
        per request, in order, as there."""
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        offsets[1:] = cuts
        if any(now is None for now in timed) and not all(now is None for now in timed):
            for n, now, lo, hi in zip(lengths, timed, offsets[:-1].tolist(), offsets[1:].tolist()):
                self._account(n, picked[lo:hi].tolist(), now)  # mixed: one at a time
            return
        self.accesses += sum(lengths)
        if not len(picked):
            return
        dist = np.empty(len(picked), dtype=np.int64)
        dts = np.empty(len(picked), dtype=np.float64)
        times = None if timed[0] is None else np.array(timed, dtype=np.float64)
        written = self._inner.step_many(picked, offsets, times, dist, dts)
        w = self.P / self.threshold
        if w != self._pend_w:
            self._flush()
            self._pend_w = w
        cold = dist == INF
        per_request = np.diff(offsets)
        cold_before = np.zeros(len(cold) + 1, dtype=np.int64)
        np.cumsum(cold, out=cold_before[1:])
        cold_per_request = cold_before[offsets[1:]] - cold_before[offsets[:-1]]
        some = per_request > 0
        for n, n_cold in zip(per_request[some].tolist(), cold_per_request[some].tolist()):
            self._w_total += w * n
            self._w_cold += w * n_cold
        self.sampled += len(picked)
        self._pend_d.append(dist)
        self._pend_t.append(dts[:written])
        self._pend_n += len(dist)
        heap = self._heap
        for h, b in zip(hashes[cold].tolist(), picked[cold].tolist()):
            heapq.heappush(heap, (-h, b))
        if self._pend_n > 1 << 16:
            self._flush()

    def _picked(self, hashes: Sequence[int]) -> list[int]:
        """The sampled blocks, in order."""
        t, seed, mod = self.threshold, self.seed, self.P
        if len(hashes) >= _VECTOR_MIN:
            try:
                blocks = np.array(hashes, dtype=np.uint64)
            except OverflowError:  # a negative or too-wide id: masked one at a time below
                pass
            else:
                keep = np.flatnonzero(xxh3_u64(blocks, seed) % np.uint64(mod) < np.uint64(t))
                return [hashes[i] for i in keep.tolist()]
        pk = _PACK_U64
        return [h for h in hashes if _xxh3(pk(h & _MASK64), seed) % mod < t]

    def _flush(self) -> None:
        """Weight each pending sample 1/R of its own time into the histograms."""
        self._drain()
        w = self._pend_w
        if self._pend_d:
            d = np.concatenate([np.asarray(c, dtype=np.int64) for c in self._pend_d])
            scaled = d[d != INF] * w // 1
            np.add.at(self._hist, self._bin(scaled), w)
            self._pend_d = []
            self._pend_n = 0
        if self._pend_t:
            t = np.concatenate([np.asarray(c, dtype=np.float64) for c in self._pend_t])
            if len(t):
                np.add.at(self._rt_hist, _rt_index(t), w)
            self._pend_t = []

    def _bin(self, scaled) -> np.ndarray:
        return np.searchsorted(self._EDGES, scaled, side="right") - 1

    def _shrink(self) -> None:
        """Lower T to the largest tracked sample hash and forget every block at or above it."""
        heap = self._heap
        while self._inner.tracked > self.max_tracked and heap:
            top = -heap[0][0]
            gone = []
            while heap and -heap[0][0] >= top:
                gone.append(heapq.heappop(heap)[1])
            self.threshold = max(1, top)
            self._inner.forget(gone)

    # ---- read-outs -------------------------------------------------------------------

    def _hits(self, capacity: float) -> float:
        """Weighted sampled accesses with scaled distance < capacity (bin interpolated)."""
        if capacity <= 0:
            return 0.0
        self._flush()
        j = int(self._bin(capacity))
        h = self._hist
        if j >= len(h) - 1:
            return float(h.sum())
        lo, hi = self._EDGES[j], self._EDGES[j + 1]
        return float(h[:j].sum() + h[j] * (capacity - lo) / (hi - lo))

    def hit_ratio_at(self, capacity: int) -> float:
        self._drain()
        if self.accesses == 0 or capacity <= 0:
            return 0.0
        if self.adjust:
            hits = self._hits(capacity) + (self.accesses - self._w_total)
            return min(max(hits / self.accesses, 0.0), 1.0)
        return self._hits(capacity) / self._w_total if self._w_total else 0.0

    def miss_ratio_curve(self, capacities: Iterable[int] | None = None) -> list[tuple[int, float]]:
        """``(capacity, estimated hit_ratio)`` pairs."""
        self._flush()
        if capacities is None:
            nz = np.flatnonzero(self._hist)
            top = int(self._EDGES[min(nz[-1] + 1, len(self._EDGES) - 1)]) if nz.size else 1
            capacities = log_capacities(top)
        return [(int(c), self.hit_ratio_at(c)) for c in capacities]

    def to_dict(self) -> dict:
        self._flush()
        e, h = self._EDGES, self._hist
        b = np.bincount(_log2_index(e), weights=h, minlength=_LOG2_BUCKETS + 1)
        return {
            "kind": "shards",
            "rate": self.rate,
            "threshold": self.threshold,
            "modulus": self.P,
            "adjust": self.adjust,
            "accesses": self.accesses,
            "sampled": self.sampled,
            "cold_estimate": self._w_cold,
            "distance_log2": _log2_dict(float(b[0]), b[1:], self._w_cold),
            "reuse_time_log2_s": _rt_list(self._rt_hist),
            "mrc": [[c, h] for c, h in self.miss_ratio_curve()],
            **self.footprint(),
        }
