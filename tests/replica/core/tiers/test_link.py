"""The link model: processor sharing, hand-worked (1 GB/s links: a gigabyte takes a second alone)."""

import pytest

from replica.core.tiers.link import Link

GB = 10**9


def test_one_transfer_takes_its_bytes_over_the_bandwidth():
    link = Link("l", 1e9)
    assert link.reserve(2.0, 3 * GB) == 5.0
    assert link.bytes_moved == 3 * GB


def test_two_equal_transfers_started_together_both_finish_at_twice_one():
    link = Link("l", 1e9)
    a, b = link.start(0.0, GB), link.start(0.0, GB)
    assert link.finish(a) == 2.0 and link.finish(b) == 2.0


def test_one_started_halfway_through_another():
    # a alone for 0.5 s (half done), then both at half speed: a's other half takes 1 s (done at 1.5),
    # b has half left then and runs alone: done at 2.0
    link = Link("l", 1e9)
    a = link.start(0.0, GB)
    assert link.finish(a) == 1.0  # alone so far
    b = link.start(0.5, GB)
    assert link.finish(a) == 1.5 and link.finish(b) == 2.0


def test_a_later_start_after_the_first_ended_runs_alone():
    link = Link("l", 1e9)
    a = link.start(0.0, GB)
    b = link.start(5.0, GB)
    assert link.finish(a) == 1.0 and link.finish(b) == 6.0 and link.in_flight == 1


def test_base_latency_adds_to_delivery_and_takes_no_bandwidth():
    # 0.25 s of latency each, plus 2 copies x 0.5 s for a: a's bandwidth phase still shares with b's
    link = Link("l", 1e9, per_copy_s=0.5, latency_s=0.25)
    assert link.reserve(0.0, GB) == 1.25
    a, b = link.start(10.0, GB, copies=2), link.start(10.0, GB)
    assert link.finish(a) == 13.25 and link.finish(b) == 12.25


def test_zero_bytes_take_only_the_latency():
    link = Link("l", 1e9, latency_s=0.1)
    big = link.start(0.0, GB)
    assert link.reserve(0.0, 0) == pytest.approx(0.1)
    assert link.finish(big) == 1.1  # the empty transfer took no share


def test_a_slower_rate_counts_as_more_of_the_link():
    # a write at 0.5 GB/s on a 1 GB/s drive is 2 s of its work; beside a 1 GB read both share
    link = Link("ssd", 1e9)
    w = link.start(0.0, GB, rate=0.5e9)
    r = link.start(0.0, GB)
    assert link.finish(r) == 2.0 and link.finish(w) == 3.0


def test_estimate_and_cancel_leave_the_link_as_it_was():
    link = Link("l", 1e9)
    a = link.start(0.0, GB)
    assert link.estimate(0.0, GB) == 2.0  # it would share with a
    assert link.finish(a) == 1.0 and link.bytes_moved == GB
    b = link.start(0.0, GB)
    link.cancel(b)
    assert link.finish(a) == 1.0 and link.bytes_moved == GB and link.in_flight == 1
