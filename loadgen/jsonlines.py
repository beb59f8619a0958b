"""The one loop over a JSON-lines file, for trace readers and request logs alike."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from typing import BinaryIO

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
