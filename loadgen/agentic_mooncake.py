"""NVIDIA Dynamo's agentic Mooncake trace, the dependency graphs ``python -m dynamo.replay`` (DynoSim, AISimulate's
engine) replays: a Mooncake row per request with a workflow layer (``dynamo_data_gen::AgenticMooncakeRow``, made by
Dynamo's ``request_trace_to_mooncake --agentic``).

Per line: ``request_id`` (the row's name), optional ``session_id``, ``input_length`` / ``output_length`` (tokens;
Dynamo also takes ``input_tokens`` / ``output_tokens``), ``hash_ids`` (Mooncake's remapped, prefix-identifying
block ids, one for a partial last block), ``timestamp`` (ms from the trace's start; ``created_time``), ``delay``
(ms; ``delay_ms``), ``wait_for`` (the request ids whose completions must arrive first), ``tool_wait_ms``,
``branches`` (the children a row spawns: ``wait_for`` read the other way) and ``prefix_reset``. As Dynamo replays
it, a row with ``wait_for`` is sent ``delay + tool_wait_ms`` after the last of them completes, a row without at
its ``timestamp``: kvemu's ``after`` and ``gap_s`` (``loadgen.dependencies``, ``loadgen.arrivals``). The rows
carry no block size (Dynamo takes it from the engine's arguments): 512 tokens, Mooncake's, unless the run says
another (``--block-size``). A row without ``session_id`` is a session of its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from loadgen.dependencies import check_dependencies, gap_seconds, refuse_other_formats, request_name, waits
from loadgen.fields import field as _field
from loadgen.fields import hash_list as _hash_list
from loadgen.trace import Trace, TraceRequest
from shared.errors import TraceFormatError

FORMAT = "agentic-mooncake"
_ALIASES = (("input_length", "input_tokens"), ("output_length", "output_tokens"), ("timestamp", "created_time"),
            ("delay", "delay_ms"))


def _canonical(path: str, lineno: int, obj: dict) -> dict:
    """``obj`` with Dynamo's aliases under their canonical names (both given: refused)."""
    for name, alias in _ALIASES:
        if alias in obj:
            if name in obj:
                raise TraceFormatError(path, lineno, alias, f"and {name} name the same field: give one")
            obj = {**obj, name: obj[alias]}
    return obj


def _row(path: str, lineno: int, obj: dict) -> TraceRequest:
    refuse_other_formats(path, lineno, obj, FORMAT)
    obj = _canonical(path, lineno, obj)
    name = request_name(path, lineno, _field(path, lineno, obj, "request_id", (str, int)), "request_id")
    after = waits(path, lineno, obj.get("wait_for", []), "wait_for")
    gap = sum(gap_seconds(path, lineno, obj[f], f, 1e-3) for f in ("delay", "tool_wait_ms") if obj.get(f) is not None)
    if name in after:
        raise TraceFormatError(path, lineno, "wait_for", f"the request waits for itself ({name!r:.40})")
    session = obj.get("session_id")
    return TraceRequest(
        t=_field(path, lineno, obj, "timestamp", (int, float), minimum=0) / 1000.0,
        session=name if session is None else request_name(path, lineno, session, "session_id"),
        turn=0,
        hash_ids=_hash_list(path, lineno, obj, "hash_ids"),
        input_tokens=_field(path, lineno, obj, "input_length", (int,), minimum=0),
        output_tokens=_field(path, lineno, obj, "output_length", (int,), minimum=0),
        kind="agent", id=name, after=after, gap_s=gap if after else 0.0,
    )


def read_agentic_mooncake(path: str | Path, lines: Iterable[tuple[int, dict]], block_size: int) -> Trace:
    """The rows of ``lines`` (line number, object) as requests, in time order (ties in the file's), each
    session's turns numbered in that order; every dependency checked against the file's ids. ``block_size``:
    the tokens an id stands for (the rows do not say)."""
    p = str(path)
    rows = [(_row(p, lineno, obj), lineno) for lineno, obj in lines]
    if not rows:
        raise TraceFormatError(p, 0, "file", "empty trace: no requests")
    check_dependencies(p, [r for r, _ in rows], [lineno for _, lineno in rows], ("request_id", "wait_for"))
    rows.sort(key=lambda row: row[0].t)
    turns: dict[str, int] = {}
    for r, _ in rows:
        r.turn = turns.get(r.session, 0)
        turns[r.session] = r.turn + 1
    meta = {"source_format": FORMAT, "partial_tail_ids": True}
    return Trace([r for r, _ in rows], block_size, p, meta)
