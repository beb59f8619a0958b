"""Trace readers: kvemu round trip, Mooncake session inference, Bailian chaining, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadgen.formats import FORMATS, detect_format, read_kvemu, read_mooncake, read_trace, write_kvemu
from loadgen.sessions import SessionInferrer
from loadgen.trace import HASHES_U64, Trace, TraceRequest
from shared.errors import InputError, TraceFormatError, UnknownNameError
from shared.hashing import ROOT_HASH, chain_ids
from tests.conftest import MOONCAKE_CONVERSATION as CONVERSATION
from tests.conftest import MOONCAKE_SYNTHETIC as SYNTHETIC


def write_lines(path: Path, records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def mc(ts_ms, ids, n_in=None, n_out=10):
    return {"timestamp": ts_ms, "input_length": n_in if n_in is not None else 512 * len(ids) - 100,
            "output_length": n_out, "hash_ids": ids}


# Request i -> (expected session, expected turn), and why.
MOONCAKE_SMALL = [
    (mc(0, [0, 1, 2, 3]), "0", 0),                     # first conversation
    (mc(1000, [0, 10, 11]), "1", 0),                   # shares only block 0 (system prompt): new session
    (mc(5000, [0, 1, 2, 20, 21, 22]), "0", 1),         # #0 minus its partial last block, then new text
    (mc(6000, [0, 10, 30]), "1", 1),                   # two shared blocks are enough
    (mc(7000, [0, 40]), "2", 0),                       # block 0 alone never joins
    (mc(8000, [0, 1, 2, 20, 21, 22, 23, 50]), "0", 2),  # continues #2 (its last block was full)
    (mc(9000, [0, *range(60, 70)]), "3", 0),           # a long prompt, tail = 66..69
    (mc(10000, [0, 60, 61, 62, 63, 90]), "4", 0),      # drops 6 of its blocks: a different conversation
    (mc(11000, [0, *range(60, 67), 91]), "3", 1),      # drops 3 (template rewrite): same conversation
]


@pytest.fixture
def mooncake_small(tmp_path):
    return write_lines(tmp_path / "mc.jsonl", [rec for rec, _, _ in MOONCAKE_SMALL])


def test_mooncake_small_sessions_and_turns(mooncake_small):
    trace = read_trace(mooncake_small)
    assert trace.block_size == 512
    assert trace.meta["source_format"] == "mooncake"
    assert [(r.session, r.turn) for r in trace.requests] == [(s, t) for _, s, t in MOONCAKE_SMALL]
    first = trace.requests[2]
    assert first.t == 5.0 and first.hash_ids == [0, 1, 2, 20, 21, 22]  # ids kept as published
    assert first.input_tokens == 512 * 6 - 100 and first.output_tokens == 10
    assert all(r.kind is None for r in trace.requests)


def test_mooncake_sorted_by_time_before_inference(tmp_path):
    path = write_lines(tmp_path / "mc.jsonl", [mc(5000, [0, 1, 2, 9]), mc(1000, [0, 1, 2, 3])])
    trace = read_trace(path, "mooncake")
    assert [r.t for r in trace.requests] == [1.0, 5.0]
    assert [(r.session, r.turn) for r in trace.requests] == [("0", 0), ("0", 1)]
    assert trace.meta["reordered_by_time"] is True


def test_session_inferrer_bounded():
    inf = SessionInferrer(tail_blocks=2, limit=4)
    assert inf.assign([0, 1, 2]) == ("0", 0)
    assert inf.assign([0, 5, 6]) == ("1", 0)
    assert inf.assign([0, 7, 8]) == ("2", 0)  # evicts session 0's ids
    assert len(inf._owner) <= 4
    assert inf.assign([0, 1, 2, 3]) == ("3", 0)
    assert inf.sessions == 4


@pytest.mark.parametrize(
    "path, requests, accesses, distinct, hit, sessions",
    [(CONVERSATION, 12_031, 288_500, 182_790, 0.366, 7_956), (SYNTHETIC, 3_993, 121_877, 43_924, 0.640, 2_263)],
    ids=["conversation", "synthetic"],
)
def test_real_mooncake_traces(path, requests, accesses, distinct, hit, sessions):
    trace = read_trace(path)
    assert len(trace.requests) == requests
    assert sum(len(r.hash_ids) for r in trace.requests) == accesses
    assert len({h for r in trace.requests for h in r.hash_ids}) == distinct
    assert round(1 - distinct / accesses, 3) == hit
    assert len({r.session for r in trace.requests}) == sessions
    # Turns are 0..n-1 in each session, in arrival order.
    seen: dict[str, int] = {}
    for r in trace.requests:
        assert r.turn == seen.get(r.session, 0)
        seen[r.session] = r.turn + 1


# --------------------------------------------------------------------------- Bailian


def bl(chat_id, parent, ts, ids, turn=1, type_="text", **extra):
    rec = {"chat_id": chat_id, "timestamp": ts, "input_length": 16 * len(ids) - 3, "output_length": 7,
           "type": type_, "turn": turn, "hash_ids": ids, **extra}
    if parent is not ...:
        rec["parent_chat_id"] = parent
    return rec


@pytest.fixture
def bailian_small(tmp_path):
    return write_lines(tmp_path / "bl.jsonl", [
        bl(1, -1, 0.0, [100, 101, 102]),
        bl(3, -1, 5.0, [100, 101, 200]),                        # same two leading blocks as chat 1
        bl(4, -1, 6.0, [999, 101, 102]),                        # raw 101, 102 under another prefix
        bl(5, 2, 20.0, [100, 101, 103, 104, 105, 106, 107], turn=3, type_="search"),  # listed before its parent
        bl(2, 1, 10.0, [100, 101, 103, 104, 105], turn=2),      # chat 1's padded last block changed
        bl(6, 77, 30.0, [300, 301], turn=4),                    # parent before the trace window
        bl(7, 77, 31.0, [300, 302], turn=4, type_="image"),
        bl(8, ..., 32.0, [100, 101, 102]),                      # no parent_chat_id: a root
    ])


def test_bailian_sessions_turns_and_order(bailian_small):
    trace = read_trace(bailian_small)
    assert trace.block_size == 16
    got = [(r.t, r.session, r.turn) for r in trace.requests]
    assert got == [(0.0, "1", 0), (5.0, "3", 0), (6.0, "4", 0), (10.0, "1", 1), (20.0, "1", 2),
                   (30.0, "77", 1), (31.0, "77", 1), (32.0, "8", 0)]
    assert trace.meta["type_counts"] == {"text": 6, "search": 1, "image": 1}
    assert trace.requests[0].input_tokens == 45 and trace.requests[0].output_tokens == 7


def test_bailian_chained_ids(bailian_small):
    by_t = {r.t: r.hash_ids for r in read_trace(bailian_small, "bailian").requests}
    c1, c3, c4, c2, c5, c8 = by_t[0.0], by_t[5.0], by_t[6.0], by_t[10.0], by_t[20.0], by_t[32.0]
    assert c1 == chain_ids([100, 101, 102], ROOT_HASH)
    # Shared parent prefix -> equal chained ids, up to the first differing block.
    assert c2[:2] == c1[:2] and c2[2] != c1[2]
    assert c5[:5] == c2 and len(set(c5)) == 7
    assert c3[:2] == c1[:2] and c3[2] != c1[2]
    assert c8 == c1  # same content from the root: same KV, same ids
    # Same raw id under a different prefix -> different chained id.
    assert c4[1] != c1[1] and c4[2] != c1[2]
    # Reusing the parent's chain gives exactly what chaining from scratch would.
    assert c5 == chain_ids([100, 101, 103, 104, 105, 106, 107])
    assert all(0 <= h < 2**64 for h in c5)


def test_bailian_cycle_is_an_error(tmp_path):
    path = write_lines(tmp_path / "cyc.jsonl", [bl(10, 11, 0.0, [1]), bl(11, 10, 1.0, [2])])
    with pytest.raises(TraceFormatError) as exc:
        read_trace(path)
    assert exc.value.field == "parent_chat_id"


def test_bailian_self_parent_is_an_error(tmp_path):
    path = write_lines(tmp_path / "self.jsonl", [bl(1, -1, 0.0, [1]), bl(2, 2, 1.0, [2])])
    with pytest.raises(TraceFormatError) as exc:
        read_trace(path)
    assert (exc.value.line, exc.value.field) == (2, "parent_chat_id")


# --------------------------------------------------------------------------- kvemu


def test_kvemu_round_trip(tmp_path):
    trace = Trace(
        requests=[
            TraceRequest(0.0, "a", 0, [2**64 - 1, 5], 40, 3, "multi"),
            TraceRequest(1.25, "a", 1, [2**64 - 1, 5, 6], 50, 4, "multi"),
            TraceRequest(2.5, "b", 0, [], 3, 1, None),
        ],
        block_size=16,
        source="unit",
        meta={"preset": "x"},
    )
    path = tmp_path / "k.jsonl"
    write_kvemu(trace, path)
    assert detect_format(path) == "kvemu"
    back = read_trace(path)
    assert back.requests == trace.requests
    assert back.block_size == 16 and back.meta["preset"] == "x"
    assert read_trace(path, "kvemu", block_size=32).block_size == 32


def test_mooncake_to_kvemu_round_trip(mooncake_small, tmp_path):
    trace = read_mooncake(mooncake_small)
    path = tmp_path / "k.jsonl"
    write_kvemu(trace, path)
    back = read_kvemu(path)
    assert back.requests == trace.requests
    assert back.block_size == 512 and back.meta["source_format"] == "mooncake"


# --------------------------------------------------------------------------- errors

GOOD_MC = json.dumps(mc(0, [0, 1]))
GOOD_BL = json.dumps(bl(1, -1, 0.0, [1]))
GOOD_KV = json.dumps({"t": 0, "session": "s", "turn": 0, "hash_ids": [1], "input_tokens": 16, "output_tokens": 1})


@pytest.mark.parametrize(
    "fmt, good, bad, field",
    [
        ("mooncake", GOOD_MC, '{"timestamp": 1, "input_length": 3,', "line"),
        ("mooncake", GOOD_MC, "[1, 2]", "line"),
        ("mooncake", GOOD_MC, b'{"timestamp": 1, "x": "\xff"}', "line"),
        ("mooncake", GOOD_MC, '{"timestamp": 1, "output_length": 1, "hash_ids": [1]}', "input_length"),
        ("mooncake", GOOD_MC, '{"timestamp": "abc", "input_length": 1, "output_length": 1, "hash_ids": [1]}', "timestamp"),
        ("mooncake", GOOD_MC, '{"timestamp": 1, "input_length": 1, "output_length": -1, "hash_ids": [1]}', "output_length"),
        ("mooncake", GOOD_MC, '{"timestamp": 1, "input_length": 1.5, "output_length": 1, "hash_ids": [1]}', "input_length"),
        ("mooncake", GOOD_MC, '{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [1]}', "timestamp"),
        ("mooncake", GOOD_MC, '{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1, "x"]}', "hash_ids[1]"),
        ("mooncake", GOOD_MC, '{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1, 2.0]}', "hash_ids[1]"),
        ("mooncake", GOOD_MC, '{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [true]}', "hash_ids[0]"),
        ("mooncake", GOOD_MC, '{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [-4]}', "hash_ids[0]"),
        ("mooncake", GOOD_MC, '{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": 7}', "hash_ids"),
        ("bailian", GOOD_BL, '{"parent_chat_id": -1, "timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1]}', "chat_id"),
        ("bailian", GOOD_BL, json.dumps(bl(2, [1], 1.0, [1])), "parent_chat_id"),
        ("bailian", GOOD_BL, json.dumps(bl(2, 1, 1.0, [1], turn="2")), "turn"),
        ("bailian", GOOD_BL, json.dumps(bl(2, 1, 1.0, [1], type_=3)), "type"),
        ("bailian", GOOD_BL, json.dumps(bl(2, 1, 1.0, [1, None])), "hash_ids[1]"),
        ("kvemu", GOOD_KV, '{"t": 0, "turn": 0, "hash_ids": [1], "input_tokens": 1, "output_tokens": 1}', "session"),
        ("kvemu", GOOD_KV, GOOD_KV.replace('"turn": 0', '"turn": -1'), "turn"),
        ("kvemu", GOOD_KV, GOOD_KV[:-1] + ', "kind": "batch"}', "kind"),
    ],
)
@pytest.mark.parametrize("blank", [b"\n", b""], ids=["blank-line", "no-blank-line"])
def test_malformed_line_names_file_line_and_field(tmp_path, fmt, good, bad, field, blank):
    # without a blank line a Mooncake file first meets the whole-column reader, which must hand over
    path = tmp_path / f"bad-{fmt}.jsonl"
    bad = bad if isinstance(bad, bytes) else bad.encode()
    path.write_bytes(good.encode() + b"\n" + blank + good.encode() + b"\n" + bad + b"\n" + good.encode() + b"\n")
    line = 4 if blank else 3
    for how in ("auto", fmt):
        with pytest.raises(TraceFormatError) as exc:
            read_trace(path, how)
        err = exc.value
        assert (err.path, err.line, err.field) == (str(path), line, field)
        assert f"{path}:{line}:" in str(err) and repr(field) in str(err)


def test_empty_file(tmp_path):
    for content in ("", "\n  \n"):
        path = tmp_path / "empty.jsonl"
        path.write_text(content)
        for fmt in ("auto", *FORMATS):
            with pytest.raises(TraceFormatError, match="empty trace") as exc:
                read_trace(path, fmt)
            assert exc.value.field == "file"


def test_missing_file(tmp_path):
    with pytest.raises(InputError) as exc:
        read_trace(tmp_path / "nope.jsonl")
    assert str(exc.value) == (f"trace: no file {tmp_path / 'nope.jsonl'}; give a trace file's path or a built-in"
                              " trace name (mooncake-conversation, mooncake-synthetic)")


@pytest.mark.parametrize("content, words", [
    ('{"kvemu_trace": 1, "block_size": 16}\n', "no requests"),
    ("version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 1\n", "Git LFS pointer"),
], ids=["header-only-kvemu-file", "git-lfs-pointer"])
def test_a_file_with_no_requests_says_what_it_is(tmp_path, content, words):
    path = tmp_path / "t.jsonl"
    path.write_text(content)
    with pytest.raises(TraceFormatError, match=words):
        read_trace(path)


def test_unknown_format_lists_valid_ones(mooncake_small):
    with pytest.raises(UnknownNameError) as exc:
        read_trace(mooncake_small, "sharegpt")
    for name in ("auto", *FORMATS):
        assert name in str(exc.value)


def test_undetectable_format(tmp_path):
    path = write_lines(tmp_path / "x.jsonl", [{"text": "hi"}])
    with pytest.raises(TraceFormatError, match="pass a format") as exc:
        read_trace(path)
    assert exc.value.line == 1
    # a completions body is a request log (loadgen.log_trace)
    assert detect_format(write_lines(tmp_path / "y.jsonl", [{"prompt": "hi"}])) == "openai"


def test_bad_block_size(mooncake_small):
    with pytest.raises(InputError, match="block_size"):
        read_trace(mooncake_small, block_size=0)
    assert read_trace(mooncake_small, block_size=256).block_size == 256


def test_compact_kvemu_stores_a_turn_as_its_shared_prefix_plus_new_hashes(tmp_path):
    reqs = [TraceRequest(0.0, "a", 0, [1, 2], 32, 4), TraceRequest(1.0, "b", 0, [7], 16, 1),
            TraceRequest(2.0, "a", 1, [1, 2, 3, 4], 64, 2, "multi"), TraceRequest(3.0, "a", 2, [1, 9], 32, 1)]
    trace = Trace(reqs, block_size=16)
    compact, full = tmp_path / "c.jsonl", tmp_path / "f.jsonl"
    write_kvemu(trace, compact)
    write_kvemu(trace, full, compact=False)
    lines = [json.loads(x) for x in compact.read_text().splitlines()]
    assert lines[0]["kvemu_trace"] == 2 and json.loads(full.read_text().splitlines()[0])["kvemu_trace"] == 1
    assert [(x["prefix"], x["hash_ids"]) for x in lines[1:]] == [(0, [1, 2]), (0, [7]), (2, [3, 4]), (1, [9])]
    for path in (compact, full):
        back = read_trace(path)
        assert [(r.session, r.turn, r.hash_ids, r.kind) for r in back.requests] == \
            [(r.session, r.turn, r.hash_ids, r.kind) for r in reqs]


def test_compact_kvemu_of_a_multi_turn_preset_is_several_times_smaller(tmp_path):
    from loadgen.workloads import generate

    trace = generate("agent", 300, seed=1)
    compact, full = tmp_path / "c.jsonl", tmp_path / "f.jsonl"
    write_kvemu(trace, compact)
    write_kvemu(trace, full, compact=False)
    assert compact.stat().st_size * 4 < full.stat().st_size
    assert [r.hash_ids for r in read_trace(compact).requests] == [r.hash_ids for r in trace.requests]


def test_compact_prefix_longer_than_the_previous_request_names_the_line(tmp_path):
    path = write_lines(tmp_path / "bad.jsonl", [
        '{"kvemu_trace": 2, "block_size": 16}',
        '{"t": 0, "session": "a", "turn": 0, "prefix": 0, "hash_ids": [1], "input_tokens": 16, "output_tokens": 1}',
        '{"t": 1, "session": "a", "turn": 1, "prefix": 3, "hash_ids": [2], "input_tokens": 32, "output_tokens": 1}',
    ])
    with pytest.raises(TraceFormatError) as err:
        read_trace(path)
    assert err.value.field == "prefix" and err.value.line == 3


def test_kvemu_written_to_a_gz_path_is_compressed_and_reads_back(tmp_path):
    import gzip

    trace = Trace([TraceRequest(0.0, "a", 0, [1, 2], 32, 4), TraceRequest(1.0, "a", 1, [1, 2, 3], 48, 2)], 16)
    path = tmp_path / "t.jsonl.gz"
    write_kvemu(trace, path)
    assert gzip.open(path).readline().startswith(b'{"kvemu_trace":2')
    assert [r.hash_ids for r in read_trace(path).requests] == [[1, 2], [1, 2, 3]]


def test_a_read_trace_vouches_for_its_hashes_and_a_written_one_does_not(tmp_path):
    # the simulator skips its own pass over the hashes where the reader checked them
    trace = read_trace("mooncake-conversation")
    assert trace.meta[HASHES_U64] is True
    write_kvemu(trace, tmp_path / "t.jsonl")
    assert HASHES_U64 not in json.loads((tmp_path / "t.jsonl").read_text().splitlines()[0])
    assert read_trace(tmp_path / "t.jsonl").meta[HASHES_U64] is True
