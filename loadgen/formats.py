"""Trace file formats: kvemu JSONL (read and write).

kvemu JSONL: an optional first line ``{"kvemu_trace": 1, "block_size": 16, ...}`` (metadata),
then one request per line with ``t``, ``session``, ``turn``, ``hash_ids``,
``input_tokens``, ``output_tokens`` and optional ``kind``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from loadgen.trace import Trace, TraceRequest
from shared.errors import TraceFormatError

KVEMU_DEFAULT_BLOCK_SIZE = 16
_KINDS = (None, "single", "multi", "agent")


def _field(path: str, lineno: int, obj: dict, name: str, types: tuple, *, required: bool = True, minimum=None):
    if name not in obj:
        if required:
            raise TraceFormatError(path, lineno, name, "missing")
        return None
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, types):
        raise TraceFormatError(path, lineno, name, f"expected {'/'.join(t.__name__ for t in types)}, got {value!r:.60}")
    if minimum is not None and value < minimum:
        raise TraceFormatError(path, lineno, name, f"must be >= {minimum}, got {value}")
    return value


def _hash_list(path: str, lineno: int, obj: dict, name: str) -> list[int]:
    ids = _field(path, lineno, obj, name, (list,))
    for i, h in enumerate(ids):
        if isinstance(h, bool) or not isinstance(h, int) or h < 0 or h >= 2**64:
            raise TraceFormatError(path, lineno, f"{name}[{i}]", f"expected a 64-bit unsigned integer, got {h!r:.60}")
    return ids


def iter_json_lines(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line; malformed JSON names file and line."""
    p = str(path)
    try:
        fh = open(p, encoding="utf-8")
    except OSError as exc:
        raise TraceFormatError(p, 0, "file", exc.strerror or str(exc)) from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TraceFormatError(p, lineno, "line", f"malformed JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(obj, dict):
                raise TraceFormatError(p, lineno, "line", "expected a JSON object")
            yield lineno, obj


def parse_kvemu_request(path: str, lineno: int, obj: dict) -> TraceRequest:
    kind = obj.get("kind")
    if kind not in _KINDS:
        raise TraceFormatError(path, lineno, "kind", f"expected one of single, multi, agent; got {kind!r:.40}")
    session = _field(path, lineno, obj, "session", (str, int))
    return TraceRequest(
        t=float(_field(path, lineno, obj, "t", (int, float), minimum=0)),
        session=str(session),
        turn=_field(path, lineno, obj, "turn", (int,), minimum=0),
        hash_ids=_hash_list(path, lineno, obj, "hash_ids"),
        input_tokens=_field(path, lineno, obj, "input_tokens", (int,), minimum=0),
        output_tokens=_field(path, lineno, obj, "output_tokens", (int,), minimum=0),
        kind=kind,
    )


def read_kvemu(path: str | Path, block_size: int | None = None) -> Trace:
    p = str(path)
    requests: list[TraceRequest] = []
    meta: dict = {}
    for lineno, obj in iter_json_lines(p):
        if "kvemu_trace" in obj:
            meta = obj
            continue
        requests.append(parse_kvemu_request(p, lineno, obj))
    bs = block_size or int(meta.get("block_size", KVEMU_DEFAULT_BLOCK_SIZE))
    return Trace(requests=requests, block_size=bs, source=p, meta=meta)


def write_kvemu(trace: Trace, path: str | Path) -> None:
    header = {"kvemu_trace": 1, "block_size": trace.block_size, "source": trace.source, **trace.meta}
    header["kvemu_trace"] = 1
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(header, separators=(",", ":")) + "\n")
        for r in trace.requests:
            rec = {
                "t": round(r.t, 6),
                "session": r.session,
                "turn": r.turn,
                "hash_ids": r.hash_ids,
                "input_tokens": r.input_tokens,
                "output_tokens": r.output_tokens,
            }
            if r.kind is not None:
                rec["kind"] = r.kind
            fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
