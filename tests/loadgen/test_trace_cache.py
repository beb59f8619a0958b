"""The parsed-trace cache: a second read gives the very same trace, from the cache."""

import json

import pytest

from loadgen import trace_cache
from loadgen.formats import read_trace
from loadgen.trace import Trace, TraceRequest


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVEMU_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "traces"


def mooncake_file(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [
    {"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [1, 2]},
    {"timestamp": 0, "input_length": 1536, "output_length": 7, "hash_ids": [1, 2, 3]},
    {"timestamp": 2000, "input_length": 600, "output_length": 1, "hash_ids": [2**64 - 1, 9]},
]


def test_second_read_comes_from_the_cache_and_is_identical(cache, tmp_path):
    path = mooncake_file(tmp_path / "mc.jsonl", ROWS)
    first = read_trace(path)
    files = list(cache.glob("*.npz"))
    assert len(files) == 1
    second = read_trace(path)
    assert second == first  # every field: times, sessions, turns, hashes (u64 max included), meta
    assert second.requests[2].hash_ids == [2**64 - 1, 9] and type(second.requests[2].hash_ids) is list


def test_changed_bytes_or_block_size_miss_the_cache(cache, tmp_path):
    path = mooncake_file(tmp_path / "mc.jsonl", ROWS)
    read_trace(path)
    read_trace(path, block_size=256)
    mooncake_file(path, ROWS[:2])
    assert len(read_trace(path).requests) == 2
    assert len(list(cache.glob("*.npz"))) == 3


def test_a_corrupt_cache_file_is_ignored_and_off_disables_it(cache, tmp_path, monkeypatch):
    path = mooncake_file(tmp_path / "mc.jsonl", ROWS)
    want = read_trace(path)
    (cached,) = cache.glob("*.npz")
    cached.write_bytes(b"not a zip")
    assert read_trace(path) == want
    monkeypatch.setenv("KVEMU_CACHE_DIR", "off")
    assert trace_cache.cache_dir() is None and read_trace(path) == want


def test_columns_round_trip_kinds_sessions_and_meta(cache):
    trace = Trace([TraceRequest(0.5, "s-a", 0, [5, 6], 32, 3, "agent"), TraceRequest(1.0, "s-b", 0, [7], 20, 1)],
                  block_size=16, source="x", meta={"workload": "mix", "params": {"a": 1}})
    trace_cache.store("k", trace)
    assert trace_cache.load("k") == trace


def test_a_turn_shares_its_predecessors_hash_objects(cache):
    big = [2**63 + i for i in range(4)]  # ints that Python never caches
    trace = Trace([TraceRequest(0.0, "a", 0, big[:2], 32, 1), TraceRequest(1.0, "b", 0, [big[0], 5], 32, 1),
                   TraceRequest(2.0, "a", 1, big[:3], 48, 1), TraceRequest(3.0, "a", 2, [big[0], big[3]], 32, 1)],
                  block_size=16, source="x")
    trace_cache.store("k", trace)
    back = trace_cache.load("k")
    assert back == trace
    a0, b0, a1, a2 = (r.hash_ids for r in back.requests)
    assert a1[0] is a0[0] and a1[1] is a0[1]  # the extended turn reuses the objects
    assert a2[0] is a1[0]  # a turn that diverges after one block shares that block
    assert b0[0] is not a0[0]  # another session: its own objects, as the JSONL readers give
