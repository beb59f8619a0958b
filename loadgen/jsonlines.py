"""The loops over a JSON-lines file, for trace readers and request logs alike: one line at a time,
naming a bad line; or a well-formed file's fields, column by column, fast (``typed_columns``: in C
where ``loadgen._traceread`` was built, else by orjson and a check of each column)."""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Callable, Iterator
from itertools import chain
from typing import BinaryIO

import orjson

from shared.errors import TraceFormatError
from shared.native import load

_scan, SCAN_MISSING = load("loadgen._traceread")


def json_lines(path: str, opened: BinaryIO, parse: Callable[[str, int, bytes], dict]) -> Iterator[tuple[int, dict]]:
    """(line number, ``parse(path, line number, line)``) for each non-blank line of ``opened`` (binary,
    closed at the end); an unreadable or corrupt compressed file names the line it reached."""
    lineno = 0
    with opened as fh:
        try:
            for lineno, line in enumerate(fh, 1):
                if line.strip():
                    yield lineno, parse(path, lineno, line)
        except (OSError, EOFError, zlib.error) as exc:  # a corrupt .gz (gzip.BadGzipFile is an OSError)
            raise TraceFormatError(path, lineno + 1, "file", f"corrupt gzip data ({exc})") from None


def json_columns(opened: BinaryIO, names: tuple[str, ...], literals: tuple[bytes, ...] = (),
                 block_bytes: int = 1 << 24) -> list[list] | None:
    """The values of ``names`` in every line of ``opened`` (closed at the end), one list per name, in a
    few C-speed passes over blocks of lines; None where any line is blank, malformed, not an object,
    lacks a name or holds one of ``literals`` (a substring search: a caller's cheap "none of these"),
    or the file is unreadable: ``json_lines`` then finds the first such line and names it."""
    columns: list[list] = [[] for _ in names]
    try:
        with opened as fh:
            for text in _whole_lines(fh, block_bytes):
                if any(literal in text for literal in literals):
                    return None
                objs = list(map(orjson.loads, text.split(b"\n")))  # as iterating a binary file splits
                for name, column in zip(names, columns):
                    column += [obj[name] for obj in objs]
    except (orjson.JSONDecodeError, KeyError, TypeError, OSError, EOFError, zlib.error):
        return None
    return columns


def _whole_line_views(fh: BinaryIO, block_bytes: int) -> Iterator[memoryview]:
    """The file in blocks of about ``block_bytes`` that each end at the end of a line (newline dropped),
    as views: a block is copied once, to join the line the previous one cut."""
    rest = b""
    while block := fh.read(block_bytes):
        if rest:
            block = rest + block
        end = block.rfind(b"\n")
        if end < 0:
            rest = block
            continue
        yield memoryview(block)[:end]
        rest = block[end + 1:]
    if rest:
        yield memoryview(rest)


def _whole_lines(fh: BinaryIO, block_bytes: int) -> Iterator[bytes]:
    """``_whole_line_views`` as bytes, for a reader that splits them."""
    return map(bytes, _whole_line_views(fh, block_bytes))


# JSON's literals, which Python reads as the integers 1 and 0: a file holding one anywhere is read line by
# line (a cheap "none of these" for the Python definition, which checks columns by type)
_BOOLEANS = (b"true", b"false")


def _numbers(column: list) -> bool:
    return set(map(type, column)) <= {int, float} and min(column) >= 0


def _ints(column: list) -> bool:
    return set(map(type, column)) == {int} and min(column) >= 0


def _hash_lists(column: list) -> bool:
    if set(map(type, column)) != {list}:
        return False
    try:  # one C pass refuses what is not an integer in [0, 2**64) (no true or false: the literals)
        array("Q", chain.from_iterable(column))
    except (TypeError, OverflowError):
        return False
    return True


# A column's kind -> its check: "n" numbers >= 0, "i" ints >= 0, "h" lists of ints in [0, 2**64)
KINDS: dict[str, Callable[[list], bool]] = {"n": _numbers, "i": _ints, "h": _hash_lists}


def typed_columns(opened: BinaryIO, names: tuple[str, ...], kinds: str, block_bytes: int = 1 << 24) -> list[list] | None:
    """``json_columns``'s columns of ``names`` where each is of its kind (a letter of ``kinds`` a name, see
    ``KINDS``) in every line, and the file holds at least one line; None otherwise (the line-by-line
    reader then names the first culprit). The one seam of the compiled scan: ``loadgen._traceread`` where
    it was built (one C pass a block, its values made as orjson makes them; it answers None wherever it
    is unsure, and the line reader decides), else orjson and a check of each column."""
    if _scan is not None:
        return _scanned_columns(opened, names, kinds, block_bytes)
    return _parsed_columns(opened, names, kinds, block_bytes)


def _parsed_columns(opened: BinaryIO, names: tuple[str, ...], kinds: str, block_bytes: int) -> list[list] | None:
    """The Python definition of ``typed_columns``."""
    columns = json_columns(opened, names, _BOOLEANS, block_bytes)
    if columns is None or not columns[0] or not all(KINDS[k](c) for k, c in zip(kinds, columns)):
        return None
    return columns


def _scanned_columns(opened: BinaryIO, names: tuple[str, ...], kinds: str, block_bytes: int) -> list[list] | None:
    """``typed_columns`` in C: the same columns, or None where the scanner is unsure. Equal ids share one int
    object (ints are immutable: nothing can tell, but memory and the caches)."""
    assert _scan is not None
    columns: list[list] = [[] for _ in names]
    keys, letters, ints = tuple(n.encode() for n in names), kinds.encode(), _scan.Interner()
    try:
        with opened as fh:
            for text in _whole_line_views(fh, block_bytes):
                if not _scan.columns(text, keys, letters, columns, ints):
                    return None
    except (OSError, EOFError, zlib.error):
        return None
    return columns if columns[0] else None
