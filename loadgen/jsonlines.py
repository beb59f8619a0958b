"""The loops over a JSON-lines file, for trace readers and request logs alike: one line at a time,
naming a bad line; or a well-formed file's fields, column by column, fast."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import BinaryIO

import orjson

from shared.errors import TraceFormatError


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


def _whole_lines(fh: BinaryIO, block_bytes: int) -> Iterator[bytes]:
    """The file in blocks of about ``block_bytes`` that each end at the end of a line (newline dropped)."""
    rest = b""
    while block := fh.read(block_bytes):
        end = block.rfind(b"\n")
        if end < 0:
            rest += block
            continue
        yield rest + block[:end]
        rest = block[end + 1:]
    if rest:
        yield rest
