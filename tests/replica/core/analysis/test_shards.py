import random

import pytest

from replica.core.analysis.shards import _DRAIN_AT, ShardsTracker


def _requests(seed: int, n: int):
    rng = random.Random(seed)
    for step in range(n):
        start = rng.randrange(400)
        yield [(start + i) * 2654435761 % (1 << 40) for i in range(rng.randrange(1, 90))], float(step)


def test_deferred_requests_account_exactly_as_one_at_a_time_even_across_shrinks():
    # max_tracked 60 at rate 0.5: the threshold drops many times inside one drain
    one, batched = ShardsTracker(rate=0.5, max_tracked=60, seed=3), ShardsTracker(rate=0.5, max_tracked=60, seed=3)
    for hashes, now in _requests(1, 3000):
        one.record(hashes, now)
        batched.defer(hashes, now)
    assert batched.threshold < round(0.5 * ShardsTracker.P)  # shrinks did happen
    assert batched.to_dict() == one.to_dict()


def test_defer_drains_on_its_own_and_before_every_read_out():
    s = ShardsTracker(rate=1.0, max_tracked=10**6)
    s.defer([1, 2, 3], 0.0)
    assert s._deferred  # queued, not yet accounted
    assert s.hit_ratio_at(10) == 0.0 and not s._deferred  # read-out drained it: three cold accesses
    s.defer([1, 2, 3], 1.0)
    assert s.tracked == 3 and s.hit_ratio_at(3) == 0.5  # the second request hits all three at capacity 3
    for i in range(_DRAIN_AT):
        s.defer([10**6 + i], 2.0)
    assert not s._deferred  # a full queue drains without a read-out


@pytest.mark.parametrize("times", ["seconds", "none", "mixed"])
def test_a_drain_that_cannot_shrink_accounts_all_its_requests_in_one_call_exactly(times):
    # max_tracked far above what is tracked: the whole queue goes to the stack at once
    one, batched = ShardsTracker(rate=0.3, seed=5, max_tracked=1 << 40), ShardsTracker(rate=0.3, seed=5, max_tracked=1 << 40)
    for k, (hashes, now) in enumerate(_requests(2, 4000)):
        when = {"seconds": now, "none": None, "mixed": None if k % 3 else now}[times]
        one.record(hashes, when)
        batched.defer(hashes, when)
        if k == 1500:
            assert batched.to_dict() == one.to_dict()  # a read-out in the middle drains too
    assert batched.to_dict() == one.to_dict()
    assert batched._heap == one._heap  # the cold blocks a shrink would forget, in heap order
