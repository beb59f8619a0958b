"""The pure-Python LRU stack (SHARDS's inner tracker): hand-worked distances, and the batched
numpy tracker's results on random streams with repeats, forgetting and renumbering."""

from __future__ import annotations

import random

from replica.core.lru_stack import INF, LruStack
from replica.core.reuse import ReuseDistanceTracker

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
