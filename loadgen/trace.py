"""The trace record every part of kvemu exchanges: one request of one session turn."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@contextmanager
def gc_paused() -> Iterator[None]:
    """Build a trace without the cyclic GC: millions of fresh lists would trigger repeated full
    collections that find nothing to free (a trace has no cycles)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclass(slots=True)
class TraceRequest:
    t: float  # seconds from trace start
    session: str
    turn: int  # 0-based within the session
    hash_ids: list[int]  # chained hashes of the prompt's blocks at the trace's block size
    input_tokens: int
    output_tokens: int
    kind: str | None = None  # single | multi | agent


@dataclass(slots=True)
class Trace:
    requests: list[TraceRequest]
    block_size: int
    source: str = ""  # file path or workload name
    meta: dict = field(default_factory=dict)


def shared_prefix(a, b) -> int:
    """How many leading hashes ``a`` and ``b`` share (a session's turn and the one before)."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):  # the common case (a next turn extends the previous prompt), in C
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
