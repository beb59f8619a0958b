"""The two loops over a JSON-lines file: line by line (naming a bad line) and by whole columns."""

import gzip
import io
import json
import os

import orjson
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

import loadgen.formats as formats
import loadgen.jsonlines as jsonlines
from loadgen.jsonlines import json_columns
from shared.errors import TraceFormatError

NAMES = ("a", "b")


def columns(text: bytes, block_bytes: int = 1 << 24, literals=()):
    return json_columns(io.BytesIO(text), NAMES, literals, block_bytes)


@pytest.mark.parametrize("block_bytes", [1, 5, 7, 1 << 24])
def test_columns_of_lines_split_across_blocks(block_bytes):
    text = b'{"a": 1, "b": [2, 3]}\n{"b": [], "a": 4.5, "c": null}\r\n{"a": 6, "b": "x"}'  # no final newline
    assert columns(text, block_bytes) == [[1, 4.5, 6], [[2, 3], [], "x"]]
    assert columns(text + b"\n", block_bytes) == [[1, 4.5, 6], [[2, 3], [], "x"]]


@pytest.mark.parametrize("text", [
    b'{"a": 1, "b": 2}\n\n{"a": 1, "b": 2}\n',  # a blank line: the line reader skips it and counts it
    b'{"a": 1, "b": 2}\n   \n',
    b'{"a": 1}\n',  # a name missing
    b'[1, 2]\n',  # not an object
    b'{"a": 1, "b": 2,\n',  # malformed
    b'{"a": NaN, "b": 2}\n',
    b'{"a": 1, "b": "\xff"}\n',  # not UTF-8
], ids=["blank", "spaces", "missing", "array", "malformed", "nan", "utf8"])
def test_anything_the_line_reader_would_name_is_none(text):
    assert columns(text) is None


def test_a_literal_anywhere_is_none_and_an_unreadable_file_too():
    assert columns(b'{"a": 1, "b": [true]}\n', literals=(b"true",)) is None
    assert columns(b'{"a": 1, "b": 2}\n', literals=(b"true",)) == [[1], [2]]
    corrupt = gzip.compress(b'{"a": 1, "b": 2}\n' * 100)[:-20]
    assert json_columns(gzip.GzipFile(fileobj=io.BytesIO(corrupt)), NAMES) is None


def test_whole_columns_read_a_mooncake_file_as_the_line_reader_does(tmp_path, monkeypatch):
    path = tmp_path / "quirks.jsonl"
    path.write_bytes(b'{"timestamp": 5, "input_length": 600, "output_length": 2, "hash_ids": [0, 1, 2]}\r\n'
                     b'{"hash_ids": [], "timestamp": 2.5, "input_length": 0, "output_length": 0, "x": "true"}\n'
                     b'{"timestamp": 9, "input_length": 1100, "output_length": 1, "hash_ids": [0, 1, 18446744073709551615]}')
    expected = [[0.005, 0.0025, 0.009], [[0, 1, 2], [], [0, 1, 2**64 - 1]], [600, 0, 1100], [2, 0, 1]]
    if jsonlines._scan is not None:  # the C scan reads "true" in a string as a string
        assert formats._well_formed_mooncake(str(path)) == expected
    with monkeypatch.context() as python:
        python.setattr(jsonlines, "_scan", None)
        rows = formats._well_formed_mooncake(str(path))
        assert rows is None  # "true" inside a string: the cheap search cannot tell, so the line reader runs
        path.write_bytes(path.read_bytes().replace(b', "x": "true"', b""))
        assert formats._well_formed_mooncake(str(path)) == expected
    fast = formats.read_trace(path, "mooncake")
    monkeypatch.setattr(formats, "_well_formed_mooncake", lambda p: None)
    slow = formats.read_trace(path, "mooncake")
    assert fast.requests == slow.requests and fast.meta == slow.meta and fast.meta["reordered_by_time"]


def test_whole_columns_give_the_builtin_trace_exactly(monkeypatch):
    fast = formats.read_mooncake(formats.resolve_trace("mooncake-conversation"))
    monkeypatch.setattr(formats, "_well_formed_mooncake", lambda p: None)
    slow = formats.read_mooncake(formats.resolve_trace("mooncake-conversation"))
    assert len(fast.requests) == 12_031 and fast.requests == slow.requests and fast.meta == slow.meta


# ---- the compiled scan (loadgen/_traceread.c) against the Python definition

needs_scan = pytest.mark.skipif(jsonlines._scan is None, reason=f"the trace reader's C scan: {jsonlines.SCAN_MISSING}")
KINDS = ("timestamp", "hash_ids", "input_length", "output_length"), "nhii"


def both(text: bytes, block_bytes: int = 1 << 24):
    """(the C scan's columns, the Python definition's), of one file's bytes."""
    names, kinds = KINDS
    return (jsonlines._scanned_columns(io.BytesIO(text), names, kinds, block_bytes),
            jsonlines._parsed_columns(io.BytesIO(text), names, kinds, block_bytes))


@pytest.mark.skipif(not os.environ.get("KVEMU_REQUIRE_COMPILED"), reason="no C compiler was found by scripts/test")
def test_the_scan_is_built_and_current_where_a_compiler_is():
    assert jsonlines._scan is not None, jsonlines.SCAN_MISSING


@needs_scan
@pytest.mark.parametrize("block_bytes", [1, 40, 1 << 24])
def test_the_scan_reads_what_the_definition_reads(block_bytes):
    text = (b'{"timestamp": 5, "input_length": 600, "output_length": 2, "hash_ids": [0, 1, 2]}\r\n'
            b' {"hash_ids":[],"timestamp":2.5e1,"input_length":0,"output_length":0,"x":{"y":[true,null,-1.5e-3,"s"]}}\n'
            b'{"timestamp": 0.125, "input_length": 1100, "output_length": 1, "hash_ids": [ 7 , 18446744073709551615 ] }\t')
    scanned, parsed = both(text, block_bytes)
    assert parsed is None  # "true" in the file: the definition's cheap search sends it to the line reader
    assert scanned == [[5, 25.0, 0.125], [[0, 1, 2], [], [7, 2**64 - 1]], [600, 0, 1100], [2, 0, 1]]
    assert [type(v) for v in scanned[0]] == [int, float, float]
    assert both(text.replace(b"true", b"null"), block_bytes) == (scanned, scanned)


@needs_scan
@pytest.mark.parametrize("line", [
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [2**64]}',
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [18446744073709551616]}',  # > u64
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [-1]}',
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1.0]}',
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [01]}',
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [true]}',
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [1,]}',
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": 3}',
    b'{"timestamp": -0.0, "input_length": 1, "output_length": 1, "hash_ids": []}',  # >= 0 in Python: the line reader's
    b'{"timestamp": 1e400, "input_length": 1, "output_length": 1, "hash_ids": []}',
    b'{"timestamp": 1, "input_length": 1.5, "output_length": 1, "hash_ids": []}',
    b'{"timestamp": 1, "input_length": 1234567890123456789, "output_length": 1, "hash_ids": []}',  # 19 digits
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [], "input_length": 2}',  # repeated
    b'{"timestamp": 1, "input_length": 1, "output_length": 1}',  # missing
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [], "n\\u0061me": 1}',  # an escape
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [], "caf\xc3\xa9": 1}',  # not ASCII
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": []} x',
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": []',
    b'',
    b'[1]',
    b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [], "x": ' + b"[" * 70 + b"]" * 70 + b"}",
])
def test_the_scan_leaves_to_python_what_it_is_not_sure_of(line, tmp_path, monkeypatch):
    good = b'{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n'
    text = good + line + b"\n" + good
    assert both(text)[0] is None
    path = tmp_path / "t.jsonl"
    path.write_bytes(text)

    def outcome():  # the requests read, or the error that names the line
        try:
            return formats.read_trace(path, "mooncake").requests
        except TraceFormatError as exc:
            return str(exc)

    scanned = outcome()
    monkeypatch.setattr(jsonlines, "_scan", None)
    assert outcome() == scanned


@needs_scan
@settings(max_examples=300, deadline=None)
@given(st.lists(st.fixed_dictionaries({
    "timestamp": st.one_of(st.integers(0, 10**18), st.integers(0, 10**6), st.floats(0, 1e300, allow_nan=False),
                           st.integers(-5, -1)),
    "hash_ids": st.one_of(st.lists(st.integers(0, 2**64 - 1), max_size=6), st.lists(st.integers(0, 9), max_size=6),
                          st.lists(st.one_of(st.integers(2**64, 2**65), st.booleans(), st.integers(0, 9)), max_size=3)),
    "input_length": st.one_of(st.integers(0, 10**18 - 1), st.integers(0, 10**19), st.floats(0, 10)),
    "output_length": st.integers(0, 10**6),
}, optional={"extra": st.recursive(st.none() | st.booleans() | st.floats(allow_nan=False, allow_infinity=False)
                                   | st.text(max_size=4) | st.integers(), lambda c: st.lists(c, max_size=3)
                                   | st.dictionaries(st.text(max_size=3), c, max_size=3), max_leaves=6)}),
    min_size=1, max_size=5), st.sampled_from([b"", b" ", b"\t", b"\r"]), st.sampled_from([1, 64, 1 << 24]))
def test_where_the_scan_answers_it_gives_the_line_readers_rows(rows, space, block_bytes):
    """The contract: columns equal to what orjson reads of each line, or None (then the line reader runs)."""
    text = b"\n".join(space + json.dumps(r).encode().replace(b",", b"," + space) + space for r in rows)
    scanned, _ = both(text, block_bytes)
    event(f"scanned: {scanned is not None}")
    if scanned is None:
        return
    names, _ = KINDS
    objs = [orjson.loads(line) for line in text.split(b"\n")]
    assert scanned == [[obj[n] for obj in objs] for n in names]
    assert [list(map(type, c)) for c in scanned[:1]] == [[type(obj["timestamp"]) for obj in objs]]


def test_a_mooncake_file_reads_the_same_with_the_scan_or_without(tmp_path, monkeypatch):
    path = tmp_path / "m.jsonl"
    path.write_bytes(b'{"timestamp": 5, "input_length": 600, "output_length": 2, "hash_ids": [0, 1, 2], "x": true}\n'
                     b'{"timestamp": 7.5, "input_length": 900, "output_length": 1, "hash_ids": [0, 1, 2, 3]}\n')
    fast = formats.read_trace(path, "mooncake")
    monkeypatch.setattr(jsonlines, "_scan", None)
    assert formats.read_trace(path, "mooncake").requests == fast.requests
    assert [(r.t, r.session, r.turn) for r in fast.requests] == [(0.005, "0", 0), (0.0075, "0", 1)]


@needs_scan
def test_equal_ids_share_one_int_across_blocks():
    big = 2**63 + 5
    text = (b'{"timestamp": 1, "input_length": 1, "output_length": 1, "hash_ids": [%d, 7000]}\n' % big) * 3
    scanned, parsed = both(text, block_bytes=40)  # a block a line
    assert scanned == parsed
    first, second, third = scanned[1]
    assert first[0] is second[0] is third[0] and first[1] is third[1]
    assert parsed[1][0][0] is not parsed[1][1][0]  # orjson makes one int per occurrence
