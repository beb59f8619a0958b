"""The pure-Python LRU stack (SHARDS's inner tracker): hand-worked distances, and the batched
numpy tracker's results on random streams with repeats, forgetting and renumbering."""

from __future__ import annotations

import random

import numpy as np
import pytest

from replica.core.analysis.lru_stack import INF, LruStack, make_lru_stack
from replica.core.analysis.reuse import ReuseDistanceTracker
from shared.native import load

A, B, C, D = 101, 202, 303, 404


def test_hand_worked_distances_and_reuse_times():
    s = LruStack()
    assert s.step([A, B, C], 1.0) == ([INF, INF, INF], [])  # stack after: A B C (A on top)
    assert s.step([C], 2.0) == ([2], [1.0])  # C below A and B; stack: C A B
    assert s.step([B, D], 4.0) == ([2, INF], [3.0])  # stack: B D C A
    assert s.step([A, A], 7.0) == ([3, 3], [6.0, 6.0])  # both read before the move
    assert s.step([D], None) == ([2], [])  # stack A B D C: D under A and B
    assert s.forget([C, 999]) == 1
    assert s.step([C, A], 9.0) == ([INF, 1], [2.0])  # C forgotten; A under D
    assert s.tracked == 4


def test_matches_the_batched_tracker_across_renumbering():
    rng = random.Random(7)
    ref, s = ReuseDistanceTracker(), LruStack()
    for k in range(3000):
        req = [rng.randrange(1500) for _ in range(rng.randint(1, 9))]  # repeats within a request too
        now = None if k % 5 == 0 else float(k)
        dist, dts = s.step(req, now)
        want, cold, dt = ref._step(req, now)
        assert dist == [INF if c else d for d, c in zip(want.tolist(), cold.tolist())]
        assert dts == ([] if dt is None else dt.tolist())
        if k % 97 == 0:
            gone = [rng.randrange(1500) for _ in range(20)]
            assert s.forget(gone) == ref.forget(gone)
    assert s.size > 1024 and s.tracked == ref.tracked  # renumbered and grown on the way


_compiled, _why = load("replica.core.compiled._lru_stack")


@pytest.mark.skipif(_compiled is None, reason=_why)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_compiled_stack_answers_as_the_python_one(seed):
    rng = random.Random(seed)
    py, c = LruStack(), _compiled.LruStack()
    assert type(make_lru_stack()) is _compiled.LruStack
    universe = [rng.randrange(1 << 64) for _ in range(900)] + [-3, 1 << 70]  # keyed mod 2^64
    for k in range(4000):
        req = [rng.choice(universe) for _ in range(rng.randint(1, 12))]  # repeats too
        now = None if k % 7 == 0 else float(k) / 3
        assert c.step(req, now) == py.step(req, now)
        if k % 53 == 0:
            gone = [rng.choice(universe) for _ in range(15)]
            assert c.forget(gone) == py.forget(gone)
        if k % 400 == 0:  # many requests at once, as SHARDS drains them
            reqs = [[rng.randrange(1 << 64) for _ in range(rng.randint(0, 6))] for _ in range(50)]
            flat = np.array([b for r in reqs for b in r], dtype=np.uint64)
            offsets = np.cumsum([0] + [len(r) for r in reqs]).astype(np.int64)
            times = None if k % 800 == 0 else np.arange(50, dtype=np.float64) + k
            out = [(np.zeros(len(flat), dtype=np.int64), np.zeros(len(flat))) for _ in range(2)]
            written = [s.step_many(flat, offsets, times, d, t) for s, (d, t) in zip((c, py), out)]
            assert written[0] == written[1]
            assert out[0][0].tolist() == out[1][0].tolist() and out[0][1][:written[0]].tolist() == out[1][1][:written[0]].tolist()
        assert (c.tracked, c.size) == (py.tracked, py.size)
    assert c.size > 1024  # renumbered and grown on the way
