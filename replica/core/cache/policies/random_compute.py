"""RandomCompute (When Fancy Eviction Fails, principle 3), and the sampled scoring it shares with PartialNode.

Both score with ``cost · f_eff / idle`` and evict the lowest score, where ``cost`` is the
pool's recompute cost at a block's depth (its index in the request),
``f_eff = f · 2^(-(now - last) / decay_halflife_s)`` an access count that decays (on each
access ``f <- f_eff + 1``; new: ``f = 1``), ``idle = max(now - last, min_idle_s)``.
Scores are compared as ``log2(cost · f) + last/halflife - log2(idle)`` (the common
``-now/halflife`` term dropped) so a day-long trace never overflows.

Candidates are the unpinned resident blocks, kept in an array plus an index map
(swap-remove, O(1) per update): a block leaves it when a request pins it and returns
on release, as in vLLM's free queue. A sample is ``sample_size`` uniform draws with
replacement from the seeded ``random.Random`` (duplicates cannot change a minimum); when
``sample_size`` >= the number of candidates every candidate is scored, which makes the
policy exact and deterministic. ``on_pin`` takes blocks out of the array when a request
pins them, before the pool asks for victims, so every candidate is evictable.

``now`` is the incoming request's time: the pool sets ``ctx.now`` before it asks for
victims, and ``victims`` reads it (``on_access`` / ``on_release`` also advance it).
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Sequence
from math import inf, log2

import numpy as np

from replica.core.cache.policies.base import Access, EvictionPolicy
from shared.validate import check_positive, check_positive_int


class SampledPolicy(EvictionPolicy):
    takes_pins = True
    def __init__(self, sample_size: int, decay_halflife_s: float, seed: int, min_idle_s: float) -> None:
        self.sample_size = check_positive_int("sample_size", sample_size)
        self.halflife = check_positive("decay_halflife_s", decay_halflife_s)
        self.min_idle = check_positive("min_idle_s", min_idle_s)
        self.seed = seed
        self._rng = random.Random(seed)
        self._now = 0.0
        self.clear()

    def clear(self) -> None:
        self._cands: list[int] = []
        self._pos: dict[int, int] = {}

    def _add(self, h: int) -> None:
        if h not in self._pos:
            self._pos[h] = len(self._cands)
            self._cands.append(h)

    def _discard(self, h: int) -> int | None:
        j = self._pos.pop(h, None)
        if j is not None:
            moved = self._cands.pop()
            if moved != h:
                self._cands[j] = moved
                self._pos[moved] = j
        return j

    def _draw(self, count: int) -> np.ndarray:
        """``count`` uniform slots in [0, n), with replacement."""
        u = np.frombuffer(self._rng.randbytes(4 * count), dtype=np.uint32)
        return (u * (len(self._cands) / 4294967296.0)).astype(np.intp)

    def on_pin(self, hashes: Sequence[int]) -> None:
        for h in hashes:
            self._discard(h)  # in use: not a candidate until released

    def _clock(self, now: float) -> None:
        if now > self._now:
            self._now = now

    def _decayed(self, f: float, last: float, now: float) -> float:
        return f * 2.0 ** (-max(now - last, 0.0) / self.halflife)

    def describe(self) -> dict:
        return {"name": self.name, "sample_size": self.sample_size, "decay_halflife_s": self.halflife,
                "min_idle_s": self.min_idle, "seed": self.seed}


class RandomComputePolicy(SampledPolicy):
    """Per block: evict the lowest ``cost(depth) · f_eff / idle`` of a fresh k-sample per victim.

    The ``need`` samples of one ``victims`` call are drawn and scored in one numpy batch;
    a sample whose best is already taken by an earlier sample of the same call falls back
    to its next best (re-drawn if none is usable).
    """

    name = "random_compute"

    def __init__(self, sample_size: int = 128, decay_halflife_s: float = 300.0, seed: int = 0,
                 min_idle_s: float = 1e-3) -> None:
        self._meta: dict[int, tuple[float, float, float]] = {}  # block -> (log2 weight, last, f)
        super().__init__(sample_size, decay_halflife_s, seed, min_idle_s)

    def clear(self) -> None:
        super().clear()
        self._meta.clear()
        self._lw = array("d")  # slot-aligned with _cands: log2(cost·f) + last/halflife
        self._last = array("d")  # slot-aligned with _cands: last access time

    def _add(self, h: int) -> None:
        if h not in self._pos:
            self._pos[h] = len(self._cands)
            self._cands.append(h)
            lw, last, _ = self._meta[h]
            self._lw.append(lw)
            self._last.append(last)

    def _discard(self, h: int) -> None:
        j = self._pos.pop(h, None)
        if j is not None:
            moved, lw, last = self._cands.pop(), self._lw.pop(), self._last.pop()
            if moved != h:
                self._cands[j], self._lw[j], self._last[j] = moved, lw, last
                self._pos[moved] = j

    def _scores(self, idx) -> np.ndarray:
        # numpy views of the array buffers: temporaries, gone before the arrays resize
        idle = np.maximum(self._now - np.frombuffer(self._last)[idx], self.min_idle)
        return np.frombuffer(self._lw)[idx] - np.log2(idle)

    def _touch(self, old: tuple | None, cost: float, now: float) -> tuple[float, float, float]:
        f = 1.0 if old is None else 1.0 + self._decayed(old[2], old[1], now)
        return log2(max(cost, 1e-300) * f) + now / self.halflife, now, f

    def on_access(self, acc: Access) -> None:
        now = acc.now
        self._clock(now)
        meta, hashes, cost = self._meta, acc.hashes, self.ctx.block_cost
        for i in acc.touched_idx:  # on_pin took them out of the candidates
            h = hashes[i]
            meta[h] = self._touch(meta.get(h), cost(i), now)
        for i in acc.new_idx:
            meta[hashes[i]] = self._touch(None, cost(i), now)

    def on_release(self, hashes: Sequence[int], now: float) -> None:
        self._clock(now)
        meta = self._meta
        for h in hashes:
            if h in meta:
                self._add(h)

    def victims(self, need: int) -> list[int]:
        self._clock(self.ctx.now)  # score at the incoming request's time
        cands, k = self._cands, self.sample_size
        chosen: dict[int, None] = {}
        if k >= len(cands):  # every candidate scored: the exact lowest-score order
            order = np.argsort(self._scores(slice(0, len(cands))), kind="stable")[:need]
            chosen = dict.fromkeys(cands[j] for j in order.tolist())
        else:
            idx = self._draw(need * k).reshape(need, k)
            scores = self._scores(idx)
            for r, c in enumerate(scores.argmin(axis=1).tolist()):
                while True:
                    h = cands[idx[r, c]]
                    if h not in chosen:
                        chosen[h] = None
                        break
                    scores[r, c] = inf
                    c = int(scores[r].argmin())
                    if scores[r, c] == inf:  # nothing usable in this sample: draw it again
                        idx[r] = self._draw(k)
                        scores[r] = self._scores(idx[r])
                        c = int(scores[r].argmin())
        for h in chosen:
            self._discard(h)
            del self._meta[h]
        return list(chosen)

    def on_remove(self, h: int) -> None:
        self._discard(h)
        self._meta.pop(h, None)
