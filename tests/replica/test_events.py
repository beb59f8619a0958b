from replica.core.cache.pool import KvEvent
from replica.events import EventFeed


def feed(mode, max_batches=4, resident=range(10)):
    return EventFeed("r", lambda: [KvEvent("stored", tuple(resident))], batch_max=4, max_batches=max_batches,
                     mode=mode)


def test_batches_are_numbered_per_event_and_split_by_size():
    f = feed("poll", max_batches=100)
    f.publish([KvEvent("stored", (1, 2)), KvEvent("removed", (3,))])
    f.publish([KvEvent("stored", tuple(range(10, 20)))])  # 10 hashes -> 3 batches of at most 4
    seqs = [(b.seq, len(b.events)) for b in f.batches]
    assert seqs == [(1, 2), (3, 1), (4, 1), (5, 1)]
    assert [len(b.events[0].hashes) for b in list(f.batches)[1:]] == [4, 4, 2]
    assert [b.seq for b in f.since(3)] == [4, 5]
    assert f.next_seq == 6


def test_poll_mode_ages_out_read_batches_without_resync():
    f = feed("poll")
    for i in range(20):  # far past the bound: no recursion, no resync storm
        f.publish([KvEvent("stored", (i,))])
    assert len(f.batches) == 4 and f.expired_batches == 16
    assert f.resyncs == 0 and f.dropped_batches == 0
    assert f.oldest_seq == 17  # a poller at cursor < 16 sees the gap and asks for /kv/resync


def test_push_mode_overflow_loses_batches_and_resyncs_once_on_the_next_publish():
    f = feed("push", resident=(7, 8))
    for i in range(5):  # the fifth overflows the 4-batch bound
        f.publish([KvEvent("stored", (i,))])
    assert f.dropped_batches == 1 and f.resyncs == 0
    f.publish([KvEvent("stored", (99,))])  # 99 is resident by now, so the resync covers it
    last = list(f.batches)[-1]
    assert f.resyncs == 1 and last.events == [KvEvent("cleared", ()), KvEvent("stored", (7, 8))]


def test_requested_resync_republishes_the_resident_set():
    f = feed("poll", max_batches=100, resident=(1, 2, 3))
    f.request_resync()
    assert [e.kind for e in f.batches[-1].events] == ["cleared", "stored"]
    assert f.batches[-1].events[1].hashes == (1, 2, 3)


def test_shipper_counts_every_batch_lost_when_redis_is_unreachable():
    """Three batches popped and refused: three lost, not one per failure, and one resync queued."""
    import asyncio
    import types

    from replica.shipper import RedisShipper
    from tests.conftest import free_port

    f = feed("push", max_batches=100, resident=(5,))
    for i in range(3):
        f.publish([KvEvent("stored", (i,))])
    owner = types.SimpleNamespace(feed=f, settings=types.SimpleNamespace(replica_id="r"))
    url = f"redis://127.0.0.1:{free_port()}/0?socket_timeout=0.5"  # nothing listens there

    async def go():
        shipper = RedisShipper(owner, url, "t")
        try:
            assert await shipper._ship(f.pop_ready()) is False
        finally:
            await shipper.close()
        return shipper

    shipper = asyncio.run(go())
    assert shipper.lost_batches == 3 and f.dropped_batches == 3 and shipper.failures == 1
    assert f.resync_pending


def test_resync_asks_in_a_row_cost_one_resync():
    f = feed("poll", max_batches=10_000, resident=range(40))
    for _ in range(200):  # issue 17: 200 asks queued 2,800 batches
        f.request_resync()
    assert f.resyncs == 1 and len(f.batches) == 11  # cleared + 40 hashes in batches of 4
    f.publish([KvEvent("stored", (99,))])
    f.request_resync()  # something happened since: a new resync
    assert f.resyncs == 2


def test_the_feed_is_bounded_by_hashes_held_not_only_by_batches():
    f = EventFeed("r", lambda: [], batch_max=512, max_batches=4096, mode="poll", max_hashes=1000)
    for i in range(100):  # 100 batches of 100 hashes: 10,100 held without the hash bound
        f.publish([KvEvent("stored", tuple(range(i * 100, i * 100 + 100)))])
    assert len(f.batches) == 9 and f.held_hashes == 909
    assert f.oldest_seq == 92 and f.expired_batches == 91
    assert [b.seq for b in f.since(95)] == [96, 97, 98, 99, 100]
    assert [b.seq for b in f.since(0, limit=2)] == [92, 93]
    assert f.since(100) == []


def test_tier_events_keep_their_tier_through_batches_resyncs_and_the_wire():
    f = EventFeed("r", lambda: [KvEvent("stored", (1,)), KvEvent("stored", (2, 3), "host")], batch_max=4,
                  max_batches=100, mode="poll")
    f.publish([KvEvent("stored", tuple(range(10, 16)), "ssd"), KvEvent("removed", (4,), "host")])
    assert [b.to_wire()["events"] for b in f.batches] == [
        [["stored", (10, 11, 12, 13), "ssd"]], [["stored", (14, 15), "ssd"]], [["removed", (4,), "host"]]]
    f.request_resync()
    assert f.batches[-1].events == [KvEvent("cleared", ()), KvEvent("stored", (1,)), KvEvent("stored", (2, 3), "host")]
