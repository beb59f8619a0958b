"""The two loops over a JSON-lines file: line by line (naming a bad line) and by whole columns."""

import gzip
import io

import pytest

import loadgen.formats as formats
from loadgen.jsonlines import json_columns

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
    rows = formats._well_formed_mooncake(str(path))
    assert rows is None  # "true" inside a string: the cheap search cannot tell, so the line reader runs
    path.write_bytes(path.read_bytes().replace(b', "x": "true"', b""))
    rows = formats._well_formed_mooncake(str(path))
    assert rows == [(0.005, [0, 1, 2], 600, 2), (0.0025, [], 0, 0), (0.009, [0, 1, 2**64 - 1], 1100, 1)]
    fast = formats.read_trace(path, "mooncake")
    monkeypatch.setattr(formats, "_well_formed_mooncake", lambda p: None)
    slow = formats.read_trace(path, "mooncake")
    assert fast.requests == slow.requests and fast.meta == slow.meta and fast.meta["reordered_by_time"]


def test_whole_columns_give_the_builtin_trace_exactly(monkeypatch):
    fast = formats.read_mooncake(formats.resolve_trace("mooncake-conversation"))
    monkeypatch.setattr(formats, "_well_formed_mooncake", lambda p: None)
    slow = formats.read_mooncake(formats.resolve_trace("mooncake-conversation"))
    assert len(fast.requests) == 12_031 and fast.requests == slow.requests and fast.meta == slow.meta
