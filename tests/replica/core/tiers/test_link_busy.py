"""The link's busy time (``busy_s``) and ``utilization``, hand-worked on 1 GB/s links (a gigabyte takes
a second alone). The sharing rule itself is tests/replica/core/tiers/test_link.py's."""

from replica.core.tiers.link import Link

GB = 10**9


def test_one_transfer_is_busy_for_its_bandwidth_phase():
    link = Link("l", 1e9)
    link.start(0.0, GB)
    assert link.utilization(2.0) == 0.5
    assert link.busy_s == 1.0


def test_utilization_while_a_transfer_is_in_flight_settles_up_to_now():
    link = Link("l", 1e9)
    tr = link.start(0.0, GB)
    assert link.utilization(0.5) == 1.0 and link.busy_s == 0.5
    assert link.finish(tr) == 1.0  # asking settled nothing it should not have
    # asked again later: the first half is not counted twice
    assert link.utilization(4.0) == 0.25 and link.busy_s == 1.0


def test_two_transfers_started_together_count_their_overlap_once():
    # both done at 2.0: two seconds busy, not four
    link = Link("l", 1e9)
    link.start(0.0, GB)
    link.start(0.0, GB)
    assert link.utilization(4.0) == 0.5 and link.busy_s == 2.0


def test_one_started_halfway_through_another():
    # a alone 0 -> 0.5, both 0.5 -> 1.5 (a done), b alone 1.5 -> 2.0: busy from 0 to 2
    link = Link("l", 1e9)
    a = link.start(0.0, GB)
    b = link.start(0.5, GB)
    assert link.finish(a) == 1.5 and link.finish(b) == 2.0
    assert link.utilization(1.0) == 1.0 and link.busy_s == 1.0
    assert link.utilization(5.0) == 0.4 and link.busy_s == 2.0


def test_idle_gaps_are_not_busy():
    # busy 0 -> 1 and 3 -> 4, idle in between and after
    link = Link("l", 1e9)
    link.start(0.0, GB)
    link.start(3.0, GB)
    assert link.utilization(2.0) == 0.5  # the gap so far
    assert link.utilization(3.5) == 1.5 / 3.5
    assert link.utilization(5.0) == 0.4 and link.busy_s == 2.0


def test_since_is_the_denominators_start():
    link = Link("l", 1e9)
    link.start(10.0, GB)
    assert link.utilization(12.0, since=10.0) == 0.5
    assert link.utilization(14.0, since=10.0) == 0.25


def test_no_interval_is_zero_utilization():
    link = Link("l", 1e9)
    link.start(0.0, GB)
    assert link.utilization(0.0) == 0.0
    assert link.utilization(1.0, since=1.0) == 0.0
    assert link.utilization(0.5, since=2.0) == 0.0  # now before since


def test_an_idle_link_is_not_busy():
    link = Link("l", 1e9)
    assert link.utilization(3.0) == 0.0 and link.busy_s == 0.0


def test_latency_is_not_busy_time():
    # delivered at 1.5, but the link moved bytes only for the first second
    link = Link("l", 1e9, per_copy_s=0.25, latency_s=0.25)
    assert link.reserve(0.0, GB, copies=1) == 1.5
    assert link.utilization(2.0) == 0.5 and link.busy_s == 1.0


def test_zero_bytes_keep_the_link_idle():
    link = Link("l", 1e9, latency_s=0.1)
    link.start(0.0, 0)
    assert link.utilization(1.0) == 0.0 and link.busy_s == 0.0


def test_a_slower_rate_is_busy_for_its_whole_work():
    # a write at 0.5 GB/s keeps the 1 GB/s link busy 2 s for a gigabyte
    link = Link("ssd", 1e9)
    link.start(0.0, GB, rate=0.5e9)
    assert link.utilization(4.0) == 0.5 and link.busy_s == 2.0


def test_estimate_and_cancel_add_no_busy_time():
    link = Link("l", 1e9)
    assert link.estimate(0.0, GB) == 1.0
    tr = link.start(0.0, GB)
    link.cancel(tr)
    assert link.utilization(2.0) == 0.0 and link.busy_s == 0.0


def test_a_start_in_the_settled_past_begins_at_the_clock():
    # utilization settled the link to 2.0; a start asked at 1.0 runs 2.0 -> 3.0
    link = Link("l", 1e9)
    assert link.utilization(2.0) == 0.0
    tr = link.start(1.0, GB)
    assert link.finish(tr) == 3.0
    assert link.utilization(4.0) == 0.25 and link.busy_s == 1.0
