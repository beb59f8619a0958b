"""The prefix index: one behavioural suite run against both backends, then wire format,
make_index, and Redis-specific guarantees (one round trip, key namespace, outages).

Redis tests use real redis-server processes on free loopback ports: the session-wide
``redis_server`` fixture (a unique cluster name per test) or a private server where a
test inspects the whole keyspace or stops the server.
"""

from __future__ import annotations

import asyncio
import random
import uuid

import msgpack
import numpy as np
import pytest
import redis
import redis.asyncio.connection as aioconn

from shared.errors import InputError
from shared.index import (
    EventBatch,
    IndexEvent,
    IndexUnavailable,
    MemoryIndex,
    PrefixIndex,
    RedisIndex,
    make_index,
    pipelined,
)
from tests.conftest import running_redis
from tests.support.index_cases import H1, H2, H3, H4, H5, H6, batch, ev, run


@pytest.fixture
def private_redis():
    with running_redis() as server:
        yield server


# ---- behaviour, both backends ---------------------------------------------------------------
def test_longest_consecutive_prefix(make):
    async def body(idx):
        assert isinstance(idx, PrefixIndex)
        await idx.apply(batch("A", 0, ev("stored", H1, H2, H3)))
        await idx.apply(batch("B", 0, ev("stored", H1, H3)))
        await idx.apply(batch("C", 0, ev("stored", H2, H3)))
        assert await idx.lookup([H1, H2, H3]) == {"A": 3, "B": 1}  # C lacks the first block
        assert await idx.lookup([H1]) == {"A": 1, "B": 1}
        assert await idx.lookup([H2, H3]) == {"A": 2, "C": 2}
        assert await idx.lookup([H1, H3]) == {"A": 2, "B": 2}
        assert await idx.lookup([H1, H2, H3, H4]) == {"A": 3, "B": 1}
        assert await idx.lookup([H4, H1]) == {}

    run(make, body)


def test_lookup_of_empty_list(make):
    async def body(idx):
        assert await idx.lookup([]) == {}
        await idx.apply(batch("A", 0, ev("stored", H1)))
        assert await idx.lookup([]) == {}
        assert await idx.lookup(()) == {}

    run(make, body)


def test_removed_and_cleared(make):
    async def body(idx):
        await idx.apply(batch("A", 0, ev("stored", H1, H2, H3)))
        await idx.apply(batch("B", 0, ev("stored", H1, H2)))
        r = await idx.apply(batch("A", 1, ev("removed", H2, H5)))  # H5 was never stored: no-op
        assert (r.applied, r.duplicate, r.reset) == (1, False, None)
        assert await idx.lookup([H1, H2, H3]) == {"A": 1, "B": 2}
        await idx.apply(batch("A", 2, ev("cleared"), ev("stored", H4)))
        assert await idx.lookup([H1, H2]) == {"B": 2}
        assert await idx.lookup([H4]) == {"A": 1}
        reps = await idx.replicas()
        assert (reps["A"].blocks, reps["A"].last_seq, reps["B"].blocks) == (1, 3, 2)
        assert (await idx.stats())["entries"] == 3

    run(make, body)


def test_epoch_change_clears_the_replica(make):
    async def body(idx):
        await idx.apply(batch("A", 0, ev("stored", H1, H2)))
        await idx.apply(batch("A", 1, ev("stored", H3)))
        await idx.apply(batch("B", 0, ev("stored", H1)))
        r = await idx.apply(batch("A", 0, ev("stored", H5), epoch="e2"))
        assert (r.reset, r.applied, r.synced) == ("epoch", 1, True)
        assert await idx.lookup([H1, H2, H3]) == {"B": 1}
        assert await idx.lookup([H5]) == {"A": 1}
        a = (await idx.replicas())["A"]
        assert (a.epoch, a.last_seq, a.blocks, a.epoch_changes) == ("e2", 0, 1, 1)
        assert (await idx.stats())["epoch_changes"] == 1

    run(make, body)


def test_seq_gap_clears_counts_and_a_cleared_resync_recovers(make):
    async def body(idx):
        await idx.apply(batch("A", 0, ev("stored", H1, H2)))
        r = await idx.apply(batch("A", 2, ev("stored", H3)))  # seq 1 was lost
        assert (r.reset, r.applied, r.synced) == ("gap", 1, False)
        assert await idx.lookup([H1, H2]) == {}
        assert await idx.lookup([H3]) == {"A": 1}
        a = (await idx.replicas())["A"]
        assert (a.gaps, a.synced, a.last_seq, a.blocks) == (1, False, 2, 1)
        assert (await idx.stats())["gaps"] == 1
        r = await idx.apply(batch("A", 3, ev("cleared"), ev("stored", H1, H2, H3)))
        assert (r.reset, r.applied, r.synced) == (None, 2, True)
        assert await idx.lookup([H1, H2, H3]) == {"A": 3}

    run(make, body)


def test_empty_batch_is_a_heartbeat_that_reveals_a_gap(make):
    async def body(idx):
        await idx.apply(batch("A", 0, ev("stored", H1)))
        assert (await idx.apply(batch("A", 1))).reset is None  # next expected is still 1
        assert (await idx.replicas())["A"].last_seq == 0
        assert (await idx.apply(batch("A", 3))).reset == "gap"
        assert await idx.lookup([H1]) == {}

    run(make, body)


def test_duplicate_and_old_batches_are_ignored(make):
    async def body(idx):
        await idx.apply(batch("A", 0, ev("stored", H1)))
        await idx.apply(batch("A", 1, ev("stored", H2)))
        await idx.apply(batch("A", 2, ev("removed", H2)))
        r = await idx.apply(batch("A", 1, ev("stored", H2)))  # a late resend must not resurrect H2
        assert (r.duplicate, r.applied, r.reset) == (True, 0, None)
        assert (await idx.apply(batch("A", 2, ev("removed", H2)))).duplicate
        assert await idx.lookup([H1, H2]) == {"A": 1}
        # A resend overlapping the last applied event applies only the unseen tail.
        r = await idx.apply(batch("A", 2, ev("removed", H2), ev("stored", H2, H3)))
        assert (r.duplicate, r.applied) == (False, 1)
        assert await idx.lookup([H1, H2, H3]) == {"A": 3}
        a = (await idx.replicas())["A"]
        assert (a.duplicate_batches, a.last_seq, a.applied_events) == (2, 3, 4)
        assert (await idx.stats())["duplicate_batches"] == 2

    run(make, body)


def test_bounded_entries_refuse_and_count_drops(make):
    async def body(idx):
        await idx.apply(batch("A", 0, ev("stored", H1, H2, H3, H4)))
        r = await idx.apply(batch("B", 0, ev("stored", H1, H2, H3)))
        assert (r.dropped_entries, r.synced) == (2, False)
        assert await idx.lookup([H1, H2, H3]) == {"A": 3, "B": 1}
        r = await idx.apply(batch("B", 1, ev("stored", H1)))  # already held: not a drop
        assert r.dropped_entries == 0
        s = await idx.stats()
        assert (s["entries"], s["dropped_entries"], s["max_entries"]) == (5, 2, 5)
        await idx.apply(batch("A", 1, ev("removed", H4)))
        assert (await idx.apply(batch("B", 2, ev("stored", H2)))).dropped_entries == 0
        # A restart frees A's entries for its own resync, even though the index was full.
        r = await idx.apply(batch("A", 0, ev("stored", H5, H6, H3), epoch="e2"))
        assert (r.reset, r.dropped_entries) == ("epoch", 0)
        assert await idx.lookup([H5, H6, H3]) == {"A": 3}
        assert (await idx.stats())["entries"] == 5
        # A cleared resync inside one batch also reuses the replica's own room.
        r = await idx.apply(batch("A", 1, ev("cleared"), ev("stored", H1, H2, H3)))
        assert r.dropped_entries == 0 and r.synced
        assert await idx.lookup([H1, H2, H3]) == {"A": 3, "B": 2}
        assert (await idx.replicas())["B"].dropped_entries == 2

    run(make, body, max_entries=5)


def test_bounded_replicas(make):
    async def body(idx):
        await idx.apply(batch("A", 0, ev("stored", H1)))
        await idx.apply(batch("B", 0, ev("stored", H1)))
        with pytest.raises(InputError) as e:
            await idx.apply(batch("C", 0, ev("stored", H1)))
        assert e.value.field == "replica_id"
        assert await idx.clear_replica("A") == 1
        await idx.apply(batch("C", 0, ev("stored", H1)))  # the freed slot is reused
        assert await idx.lookup([H1]) == {"B": 1, "C": 1}

    run(make, body, max_replicas=2)


def test_clear_replica_forgets_it(make):
    async def body(idx):
        await idx.apply(batch("A", 0, ev("stored", H1, H2)))
        await idx.apply(batch("B", 0, ev("stored", H1)))
        assert await idx.clear_replica("A") == 2
        assert await idx.clear_replica("nobody") == 0
        assert set(await idx.replicas()) == {"B"}
        assert await idx.lookup([H1, H2]) == {"B": 1}
        assert (await idx.stats())["entries"] == 1
        # It comes back mid-stream: accepted, but the index knows its view is partial.
        r = await idx.apply(batch("A", 7, ev("stored", H3)))
        assert (r.reset, r.synced) == (None, False)
        assert await idx.lookup([H3]) == {"A": 1}

    run(make, body)


def test_accepts_block_pool_events(make):
    from replica.core.cache.pool import KvEvent

    async def body(idx):
        await idx.apply(EventBatch("A", "e1", 0, [KvEvent("stored", (H1, H2)), KvEvent("removed", (H2,))]))
        assert await idx.lookup([H1, H2]) == {"A": 1}

    run(make, body)


@pytest.mark.parametrize("seed", [7, 8])
def test_random_event_streams_match_a_reference_model(make, seed):
    """Random stored/removed/cleared streams, restarts, lost batches and forgotten
    replicas: the index must agree with a per-replica set model (each loss clears the
    replica in both).  Redis unlinks one retired entry per batch here, so lookups run
    while stale bits linger."""
    names = "ABCDEFGHIJKL"  # 12 replicas: bitmaps span two bytes

    async def body(idx):
        rng = random.Random(seed)
        universe = [rng.getrandbits(64) for _ in range(40)]
        model: dict[str, set[int]] = {r: set() for r in names}
        seqs = dict.fromkeys(names, 0)
        epochs = dict.fromkeys(names, 0)
        for _ in range(400):
            rid = rng.choice(names)
            roll = rng.random()
            if roll < 0.05:  # restart
                epochs[rid] += 1
                seqs[rid] = 0
                model[rid] = set()
            elif roll < 0.1:  # a batch is lost
                seqs[rid] += 1
                model[rid] = set()
            elif roll < 0.13:  # the router forgets it; it later reappears mid-stream
                await idx.clear_replica(rid)
                model[rid] = set()
            events = []
            for _ in range(rng.randint(0, 3)):
                kind = rng.choices(["stored", "removed", "cleared"], [6, 3, 1])[0]
                hs = [] if kind == "cleared" else rng.sample(universe, rng.randint(1, 8))
                events.append(IndexEvent(kind, tuple(hs)))
                if kind == "stored":
                    model[rid].update(hs)
                elif kind == "removed":
                    model[rid].difference_update(hs)
                else:
                    model[rid].clear()
            await idx.apply(EventBatch(rid, f"e{epochs[rid]}", seqs[rid], events))
            seqs[rid] += len(events)
            prompt = rng.sample(universe, rng.randint(0, 12))
            assert await idx.lookup(prompt) == _expected(model, prompt)
        reps = await idx.replicas()
        assert {r: s.blocks for r, s in reps.items()} == {r: len(m) for r, m in model.items() if r in reps}
        assert (await idx.stats())["entries"] == sum(len(m) for m in model.values())

    run(make, body, gc_chunk=1)


def _expected(model: dict[str, set[int]], prompt: list[int]) -> dict[str, int]:
    out = {}
    for rid, held in model.items():
        n = 0
        while n < len(prompt) and prompt[n] in held:
            n += 1
        if n:
            out[rid] = n
    return out


# ---- wire format ------------------------------------------------------------------------------
def test_wire_round_trip():
    b = batch("replica-0", 41, ev("stored", H1, H2, H3, H4), ev("removed", H2), ev("cleared"), epoch="boot-7")
    back = EventBatch.from_wire(b.to_wire())
    assert back == b
    assert back.events[0] == ev("stored", H1, H2, H3, H4)
    assert isinstance(back.events[0].hashes, tuple)
    assert back.last_seq == 43
    assert EventBatch.from_wire(bytearray(batch("r", 0).to_wire())).events == []


def _wire(**over) -> bytes:
    obj = {"replica_id": "A", "epoch": "e1", "seq": 0, "events": [["stored", [1, 2, 3]]]}
    obj.update(over)
    return msgpack.packb({k: v for k, v in obj.items() if v is not _DROP})


_DROP = object()


@pytest.mark.parametrize("data, field", [
    (b"\xc1", "batch"),  # a byte msgpack never uses
    (b"\x93\x01", "batch"),  # truncated array
    (_wire() + b"\x00", "batch"),  # trailing bytes
    (b"", "batch"),
    (msgpack.packb([1, 2]), "batch"),
    (_wire(seq=_DROP), "seq"),
    (_wire(extra=1), "extra"),
    (_wire(replica_id=5), "replica_id"),
    (_wire(replica_id=""), "replica_id"),
    (_wire(epoch=None), "epoch"),
    (_wire(seq="1"), "seq"),
    (_wire(seq=-1), "seq"),
    (_wire(seq=True), "seq"),
    (_wire(seq=1.0), "seq"),
    (_wire(seq=2**53), "seq"),
    (_wire(events={"a": 1}), "events"),
    (_wire(events=[["stored"]]), "events[0]"),
    (_wire(events=[["stored", [1]], ["evicted", [1]]]), "events[1].kind"),
    (_wire(events=[["stored", 7]]), "events[0].hashes"),
    (_wire(events=[["stored", [1, 2.5]]]), "events[0].hashes[1]"),
    (_wire(events=[["stored", [1, 2, -3]]]), "events[0].hashes[2]"),
    (_wire(events=[["stored", [1, "2"]]]), "events[0].hashes[1]"),
    (_wire(events=[["removed", [True]]]), "events[0].hashes[0]"),
    (_wire(events=[["cleared", [1]]]), "events[0].hashes"),
])
def test_malformed_wire_input_names_the_field(data, field):
    with pytest.raises(InputError) as e:
        EventBatch.from_wire(data)
    assert e.value.field == field


def test_wire_rejects_non_bytes_and_hash_out_of_range():
    with pytest.raises(InputError) as e:
        EventBatch.from_wire("not bytes")
    assert e.value.field == "batch"
    with pytest.raises(InputError) as e:  # msgpack cannot even carry it: caught when built
        EventBatch("A", "e1", 0, [("stored", (1, 2**64))])
    assert e.value.field == "events[0].hashes[1]"


def test_numpy_hashes_become_python_ints():
    b = EventBatch("A", "e1", 0, [("stored", np.array([1, 2**64 - 1], dtype=np.uint64))])
    assert b.events[0].hashes == (1, 2**64 - 1)
    assert all(type(h) is int for h in b.events[0].hashes)


# ---- make_index ---------------------------------------------------------------------------------
def test_make_index_specs():
    assert isinstance(make_index("memory"), MemoryIndex)
    assert make_index("memory?max_entries=10").max_entries == 10
    r = make_index("redis://127.0.0.1:1/3?cluster=blue&max_replicas=8")
    assert isinstance(r, RedisIndex)
    assert (r.url, r.cluster, r.prefix, r.max_replicas) == ("redis://127.0.0.1:1/3", "blue", "kvemu:blue:", 8)
    assert make_index("redis://127.0.0.1:1/0").cluster == "default"


@pytest.mark.parametrize("spec", ["", "mem", "mongodb://x", "redis://h:1/0?bogus=1",
                                  "redis://h:1/0?cluster=bad name", "memory?max_entries=-1", None])
def test_make_index_rejects_unknown_specs(spec):
    with pytest.raises(InputError) as e:
        make_index(spec)
    assert e.value.field == "index"


# ---- Redis specifics ------------------------------------------------------------------------------
def test_redis_lookup_is_one_round_trip(redis_server, monkeypatch):
    sends = []
    original = aioconn.AbstractConnection.send_packed_command
    original_pack = pipelined.pack

    async def counting(self, command, check_health=True):
        sends.append(command)
        return await original(self, command, check_health)

    def counting_pack(*args):  # the pipelined connection lookups use on redis:// URLs
        sends.append(args)
        return original_pack(*args)

    async def main():
        idx = RedisIndex(redis_server.url, cluster=f"t{uuid.uuid4().hex[:12]}")
        try:
            prompt = [random.getrandbits(64) for _ in range(64)]
            for r in range(16):
                await idx.apply(batch(f"r{r}", 0, ev("stored", *prompt[: 4 * r + 1])))
            expected = {f"r{r}": 4 * r + 1 for r in range(16)}
            assert await idx.lookup(prompt) == expected  # warm: connection open, script loaded
            info = redis.Redis.from_url(redis_server.url)
            before = info.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
            monkeypatch.setattr(aioconn.AbstractConnection, "send_packed_command", counting)
            monkeypatch.setattr(pipelined, "pack", counting_pack)
            assert await idx.lookup(prompt) == expected
            monkeypatch.undo()
            after = info.info("commandstats")["cmdstat_evalsha"]["calls"]
            info.close()
            assert len(sends) == 1
            assert after - before == 1
        finally:
            await idx.close()

    asyncio.run(main())


def test_redis_keys_are_namespaced_and_garbage_is_collected(private_redis):
    async def main():
        a = RedisIndex(private_redis.url, cluster="blue", max_entries=150)
        b = RedisIndex(private_redis.url, cluster="green")
        try:
            assert a._client is None  # lazily connected, then both share the process's pool
            first = [random.getrandbits(64) for _ in range(100)]
            second = [random.getrandbits(64) for _ in range(100)]
            await a.apply(batch("A", 0, ev("stored", *first)))
            await b.apply(batch("A", 0, ev("stored", *first[:3])))
            assert a._pool is b._pool
            r = await a.apply(batch("A", 0, ev("stored", *second), epoch="e2"))  # 100 become garbage
            assert (r.reset, r.dropped_entries) == ("epoch", 0)
            assert await a.lookup(first) == {}
            assert await b.lookup(first) == {"A": 3}  # clusters do not see each other
            assert await a.lookup(second) == {"A": 100}
            await a.clear_replica("A")
            assert (await a.stats())["entries"] == 0
            sync = redis.Redis.from_url(private_redis.url, decode_responses=True)
            stats = sync.info("commandstats")  # the index itself never walked the keyspace
            assert "cmdstat_scan" not in stats and "cmdstat_keys" not in stats
            keys = set(sync.scan_iter("*"))
            assert keys and all(k.startswith(("kvemu:blue:", "kvemu:green:")) for k in keys)
            assert not [k for k in keys if k.startswith("kvemu:blue:b:")]  # no leaked entries
            sync.close()
        finally:
            await a.close()
            await b.close()

    asyncio.run(main())


def test_redis_unavailable_is_a_clear_error_and_recovers(private_redis):
    async def main():
        idx = RedisIndex(private_redis.url, cluster="outage", timeout=1.0)
        try:
            await idx.apply(batch("A", 0, ev("stored", H1, H2)))
            assert await idx.lookup([H1, H2]) == {"A": 2}
            private_redis.stop()
            calls = [idx.apply(batch("A", 1, ev("stored", H3))), idx.lookup([H1]), idx.clear_replica("A"),
                     idx.replicas(), idx.stats()]
            for call in calls:
                with pytest.raises(IndexUnavailable) as e:
                    await call
                assert private_redis.url in str(e.value)
                assert e.value.url == private_redis.url
            private_redis.start()  # same port, empty data (no persistence)
            assert await idx.lookup([H1]) == {}
            r = await idx.apply(batch("A", 2, ev("stored", H1)))  # first contact again, mid-stream
            assert (r.reset, r.synced) == (None, False)
            assert await idx.lookup([H1]) == {"A": 1}
        finally:
            await idx.close()

    asyncio.run(main())


def test_redis_stale_bits_never_answer(redis_server):
    async def main():
        idx = RedisIndex(redis_server.url, cluster=f"t{uuid.uuid4().hex[:12]}", gc_chunk=1)
        try:
            prompt = [random.getrandbits(64) for _ in range(50)]
            await idx.apply(batch("A", 0, ev("stored", *prompt)))
            await idx.apply(batch("B", 0, ev("stored", *prompt[:10])))
            await idx.apply(batch("A", 1, ev("cleared"), ev("stored", *prompt[:5])))
            assert (await idx.stats())["gc_pending_entries"] == 50  # A's old bits are all still set
            assert await idx.lookup(prompt) == {"A": 5, "B": 10}
            await idx.apply(batch("A", 3, ev("removed", prompt[0])))
            assert await idx.lookup(prompt) == {"B": 10}
            assert (await idx.stats())["gc_pending_entries"] == 49
        finally:
            await idx.close()

    asyncio.run(main())


def test_redis_timeout_is_unavailable_then_recovers(private_redis):
    async def main():
        idx = RedisIndex(private_redis.url, cluster="slow", timeout=0.3)
        admin = redis.Redis.from_url(private_redis.url)
        try:
            await idx.apply(batch("A", 0, ev("stored", H1)))
            admin.execute_command("CLIENT", "PAUSE", 1500, "ALL")  # the real server stops replying
            with pytest.raises(IndexUnavailable) as e:
                await idx.lookup([H1])
            assert "no reply within 0.3s" in str(e.value) and private_redis.url in str(e.value)
            admin.execute_command("CLIENT", "UNPAUSE")
            assert await idx.lookup([H1]) == {"A": 1}
        finally:
            admin.close()
            await idx.close()

    asyncio.run(main())


def test_redis_concurrent_calls_share_a_small_pool(redis_server):
    async def main():
        idx = RedisIndex(redis_server.url, cluster=f"t{uuid.uuid4().hex[:12]}", pool_size=2)
        try:
            prompts = [[random.getrandbits(64) for _ in range(8)] for _ in range(32)]
            await asyncio.gather(*(idx.apply(batch(f"r{i}", 0, ev("stored", *p[: i % 8 + 1])))
                                   for i, p in enumerate(prompts)))
            got = await asyncio.gather(*(idx.lookup(p) for p in prompts))
            assert got == [{f"r{i}": i % 8 + 1} for i in range(32)]
        finally:
            await idx.close()

    asyncio.run(main())


@pytest.mark.parametrize("url", ["http://x", "redis://h:notaport/0", 5])
def test_redis_bad_url_is_an_input_error(url):
    with pytest.raises(InputError) as e:
        RedisIndex(url)
    assert e.value.field == "url"


def test_redis_url_password_is_not_shown():
    idx = RedisIndex("redis://user:secret@127.0.0.1:1/0")
    assert "secret" not in idx.safe_url and "127.0.0.1:1" in idx.safe_url


def test_a_redis_urls_password_splits_off_for_the_environment():
    from shared.index.redis_index import split_password

    assert split_password("redis://:s3cret@127.0.0.1:6379/0") == ("redis://127.0.0.1:6379/0", "s3cret")
    assert split_password("rediss://ops:pw@redis-host/2?ssl_cert_reqs=none") == (
        "rediss://ops@redis-host/2?ssl_cert_reqs=none", "pw")
    assert split_password("redis://127.0.0.1:6379/0") == ("redis://127.0.0.1:6379/0", None)
