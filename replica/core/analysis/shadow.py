"""Shadow replay for the ``adaptive`` policy (WAKMan, Workload Aware KVCache Manager): record an interval's
calls on the pool, then replay them through one small shadow cache per candidate policy.

A shadow cache is a real ``BlockPool`` (no events) with a real policy instance, and it is given the
calls the replica's pool ran, in their order (``PoolOp``, from ``BlockPool`` itself): lookups served
alone (``serve``, the simulator's cache-only path), lookups held while their request runs
(``acquire`` ... ``release``: the shadow pins them as long), the blocks a running request's decoding
fills (``fill`` ... ``release``: pinned as long, no lookup), and the response blocks a finished request
stores (``store``: not a lookup; the pool's own rule of what it inserts, applied to the shadow's
residency). So a response kept in the replica's cache is kept in the shadow's, and where the scheduler
stores it before it releases the prompt (vLLM frees a finished request's blocks tail first) the
shadow's policy hears the two in that order too. Each interval is replayed from a cold shadow, as
WAKMan does.

Capacity: the interval's mean number of blocks the hashed cache can use, ``capacity - private``
(the unhashed decode-KV blocks running requests hold), sampled at every lookup. WAKMan sizes its
shadows by the mean free-block queue (``capacity - pinned - private``) because its shadows hold no
pins; these shadows pin what the replica pins, so only the private blocks are taken off. In the
simulator's cache-only mode nothing is pinned or private and both are the capacity. The hit ratio of
a candidate is its shadow's hits (by the pool's hit mode: ``prefix`` counts up to the first miss, as
the replica counts) over the blocks looked up in the interval; stored blocks are no lookup.

``sampled`` estimator (SHARDS-style): only blocks whose hash falls in a fixed ``rate`` fraction of the
hash space are recorded, and the shadows run at ``capacity * rate``. Every access to a sampled block is
kept, so reuse among sampled blocks is preserved; a request becomes its sampled sub-sequence, which has
gaps, so sampled shadows count hits in ``holes`` mode (any resident block of it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from replica.core.cache.policies import make_policy
from replica.core.cache.pool import BlockPool, PoolBusyError
from replica.core.cache.types import ACQUIRE, FILL, RELEASE, SERVE, STORE, Allocation, Lookup, PoolOp

_MODULUS = 1 << 24
_MIX = 0x9E3779B97F4A7C15  # a multiplicative hash spreads structured ids over the sample space


def sampled(h: int, threshold: int) -> bool:
    """True for the hashes in the sample: ``threshold / 2**24`` of the hash space."""
    return ((h * _MIX) >> 16) % _MODULUS < threshold


class ShadowCall(NamedTuple):
    """One recorded pool call: its kind, the (sampled) hashes, its time and, for an acquire and its
    release, the key that pairs them (``id`` of the hashes object the pool was given)."""

    kind: int
    hashes: Sequence[int]
    now: float
    key: int = 0
    session: str | None = None


class ShadowRecorder:
    """The pool calls of the current interval and the mean usable capacity over its lookups."""

    def __init__(self, rate: float = 1.0) -> None:
        self.rate = rate
        self._threshold = int(rate * _MODULUS)
        self.calls: list[ShadowCall] = []
        self.blocks = 0  # lookup block accesses recorded (after sampling)
        self._open: dict[int, int] = {}  # key -> acquires recorded this interval and not yet released
        self._room_sum = 0
        self._samples = 0  # lookups seen, sampled or not

    def _kept(self, hashes: Sequence[int]) -> Sequence[int]:
        if self.rate >= 1:
            return hashes
        thr, mix, mod = self._threshold, _MIX, _MODULUS
        return [h for h in hashes if ((h * mix) >> 16) % mod < thr]  # sampled(), inlined

    def record(self, op: PoolOp, capacity: int) -> None:
        kind = op.kind
        if kind == RELEASE:
            key = id(op.hashes)
            left = self._open.get(key, 0)
            if left:  # a release of a request acquired before this interval has nothing to undo in a cold shadow
                calls = self.calls
                last = calls[-1]
                if last.kind == ACQUIRE and last.key == key:  # released at once: BlockPool.serve, one pass
                    calls[-1] = last._replace(kind=SERVE, key=0)
                else:
                    calls.append(ShadowCall(RELEASE, (), op.now, key))
                if left == 1:
                    del self._open[key]
                else:
                    self._open[key] = left - 1
            return
        kept = self._kept(op.hashes)
        if kind == STORE:
            if kept:
                self.calls.append(ShadowCall(STORE, kept, op.now, 0, op.session))
            return
        if kind == FILL:  # no lookup: pinned as the replica pins them, until their release
            key = id(op.hashes)
            self._open[key] = self._open.get(key, 0) + 1
            self.calls.append(ShadowCall(FILL, kept, op.now, key, op.session))
            return
        self._room_sum += capacity - op.private
        self._samples += 1
        if not kept:
            return
        self.blocks += len(kept)
        if kind == ACQUIRE:
            key = id(op.hashes)
            self._open[key] = self._open.get(key, 0) + 1
            self.calls.append(ShadowCall(ACQUIRE, kept, op.now, key, op.session))
        else:
            self.calls.append(ShadowCall(SERVE, kept, op.now, 0, op.session))

    def mean_room(self) -> float:
        n = self._samples
        return self._room_sum / n if n else 0.0

    def shadow_capacity(self) -> int:
        return max(1, round(self.mean_room() * self.rate))

    def hit_mode(self, pool_hit_mode: str) -> str:
        """The pool's hit mode, or ``holes`` for a sampled sub-sequence (its gaps are no misses)."""
        return pool_hit_mode if self.rate >= 1 else "holes"


def shadow_pool(calls: Sequence[ShadowCall], capacity: int, policy: str,
                hit_mode: str = "holes") -> tuple[BlockPool, int, int]:
    """A cold pool of ``capacity`` blocks running ``policy`` after ``calls``: (pool, hits, blocks looked up).

    A lookup longer than the shadow keeps only its first ``capacity`` blocks (the rest count as misses:
    they are still looked up). One the shadow cannot hold while its pinned blocks fill it is all misses.
    """
    pool = BlockPool(capacity, make_policy(policy), emit_events=False, hit_mode=hit_mode)
    held: dict[int, list[Allocation]] = {}
    hits = total = 0
    for kind, hashes, now, key, session in calls:
        if kind == STORE:
            pool.store(hashes, session, now)
            continue
        if kind == RELEASE:
            stack = held.get(key)
            if stack:
                pool.release(stack.pop(), now)
            continue
        if kind == FILL:  # a running request's filled blocks: held, never a lookup
            try:
                if len(hashes) <= capacity:
                    held.setdefault(key, []).append(pool.acquire(Lookup(hashes, session, now, record=False)))
            except PoolBusyError:  # its pinned blocks fill the shadow: the blocks stay out, as a lookup's would
                pass
            continue
        total += len(hashes)
        lookup = Lookup(hashes if len(hashes) <= capacity else hashes[:capacity], session, now)
        try:
            alloc = pool.serve(lookup) if kind == SERVE else pool.acquire(lookup)
        except PoolBusyError:
            continue
        if kind == ACQUIRE:
            held.setdefault(key, []).append(alloc)
        hits += len(alloc.hit_idx)
    return pool, hits, total


def replay(calls: Sequence[ShadowCall], capacity: int, policy: str, hit_mode: str = "holes") -> float:
    """Hit ratio of ``policy`` on ``calls`` from a cold pool of ``capacity`` blocks."""
    _, hits, total = shadow_pool(calls, capacity, policy, hit_mode)
    return hits / total if total else 0.0


def estimate(recorder: ShadowRecorder, candidates: Sequence[str],
             hit_mode: str = "holes") -> tuple[int, dict[str, float]]:
    """(shadow capacity, hit ratio per candidate) for the recorded interval; ``hit_mode`` the pool's."""
    cap = recorder.shadow_capacity()
    mode = recorder.hit_mode(hit_mode)
    return cap, {name: replay(recorder.calls, cap, name, mode) for name in candidates}
