"""Shadow replay for the ``adaptive`` policy (WAKMan, Workload Aware KVCache Manager): record an interval's block
accesses, then replay them through one small shadow cache per candidate policy.

A shadow cache is a real ``BlockPool`` (no events, ``holes`` hit mode) with a real policy
instance, so a candidate behaves in the shadow exactly as it would run. Each interval is
replayed from a cold shadow, as WAKMan does; requests are served one at a time.

Capacity: the interval's mean number of evictable blocks (``capacity - pinned``, sampled at
every access), WAKMan's "average free-block queue size". The hit ratio of a candidate is
shadow block hits / blocks looked up in the interval.

``sampled`` estimator (SHARDS-style): only blocks whose hash falls in a fixed ``rate``
fraction of the hash space are recorded, and the shadows run at ``capacity * rate``. Every
access to a sampled block is kept, so reuse among sampled blocks is preserved; a request
becomes its sampled sub-sequence (``holes`` mode reuses any resident block of it).
"""

from __future__ import annotations

from collections.abc import Sequence

from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool
from replica.core.cache.types import Lookup

_MODULUS = 1 << 24
_MIX = 0x9E3779B97F4A7C15  # a multiplicative hash spreads structured ids over the sample space


def sampled(h: int, threshold: int) -> bool:
    """True for the hashes in the sample: ``threshold / 2**24`` of the hash space."""
    return ((h * _MIX) >> 16) % _MODULUS < threshold


class ShadowRecorder:
    """Accesses of the current interval and the mean evictable-block count over them."""

    def __init__(self, rate: float = 1.0) -> None:
        self.rate = rate
        self._threshold = int(rate * _MODULUS)
        self.requests: list[list[int]] = []
        self.blocks = 0  # block accesses recorded (after sampling)
        self._evictable_sum = 0
        self._samples = 0  # accesses seen, sampled or not

    def record(self, hashes: Sequence[int], evictable: int) -> None:
        if self.rate < 1:
            thr, mix, mod = self._threshold, _MIX, _MODULUS
            kept = [h for h in hashes if ((h * mix) >> 16) % mod < thr]  # sampled(), inlined
        else:
            kept = list(hashes)
        if kept:
            self.requests.append(kept)
            self.blocks += len(kept)
        self._evictable_sum += evictable
        self._samples += 1

    def mean_evictable(self) -> float:
        n = self._samples
        return self._evictable_sum / n if n else 0.0

    def shadow_capacity(self) -> int:
        return max(1, round(self.mean_evictable() * self.rate))


def replay(requests: Sequence[Sequence[int]], capacity: int, policy: str) -> float:
    """Hit ratio of ``policy`` on ``requests`` from a cold pool of ``capacity`` blocks.

    A request longer than the shadow keeps only its first ``capacity`` blocks; the rest
    count as misses (they are still in the denominator).
    """
    pool = BlockPool(capacity, make_policy(policy), emit_events=False, hit_mode="holes")
    hits = total = 0
    serve = pool.serve
    for t, hashes in enumerate(requests):
        total += len(hashes)
        alloc = serve(Lookup(hashes if len(hashes) <= capacity else hashes[:capacity], now=float(t)))
        hits += len(alloc.hit_idx)
    return hits / total if total else 0.0


def estimate(recorder: ShadowRecorder, candidates: Sequence[str]) -> tuple[int, dict[str, float]]:
    """(shadow capacity, hit ratio per candidate) for the recorded interval."""
    cap = recorder.shadow_capacity()
    return cap, {name: replay(recorder.requests, cap, name) for name in candidates}
