"""SemiAnalysis's Claude Code traces (the ``cc-traces`` datasets, ``semianalysisai/cc-traces-weka-*``), the schema
the open-source readers share (AIPerf's Weka trace loader, BLIS, inference-perf, guidellm): one agent session a
line, ``{id, models, block_size, hash_id_scope, requests}``.

* ``requests`` in order: API calls (``type`` ``n`` normal or ``s`` streaming: ``t`` seconds from the session's start,
  ``model``, ``in`` / ``out`` tokens, ``hash_ids`` of ``block_size``-token blocks (64), one for a partial last block,
  ``input_types``, ``output_types``, ``stop``, optional ``api_time`` (the server's seconds), ``think_time``,
  ``ttft``), and subagents (``type`` ``subagent``: ``t``, ``agent_id``, ``subagent_type``, ``status``, ``requests`` of
  their own, nested subagents too).
* Each call waits for the session's call before it (``after``), its gap the recorded one: ``think_time`` where
  given, else its ``t`` minus the latest finish (``t + api_time``) of what it waits for. A subagent's first call
  waits for its parent's call before the spawn, so subagents spawned one after another run at once (a fan-out),
  and the parent's next call waits for all of them (the join), unless a subagent's ``status`` is
  ``async_launched`` (launched in the background: nothing waits for it).
* Subagents' calls keep the parent's session (``id``): session affinity and cache-aware routing see one agent.
* ``hash_id_scope`` ``local``: ids name blocks within one session (its subagents included), so they are chained
  after a root of the session's own; ``global``: one namespace over the file. Each session starts at time 0, its
  calls at their ``t``: the traces say when a session's calls came, not when sessions began.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from loadgen.dependencies import refuse_other_formats
from loadgen.trace import Trace, TraceRequest
from shared.errors import TraceFormatError
from shared.hashing import ROOT_HASH, chain_ids, content_id

FORMAT = "cc-traces"
_CALLS = ("n", "s")
_U64 = 2**64


def _value(path: str, lineno: int, obj: dict, key: str, where: str, types: tuple, optional: bool = False):
    field = f"{where}.{key}" if where else key
    if key not in obj or obj[key] is None:
        if optional:
            return None
        raise TraceFormatError(path, lineno, field, "missing")
    v = obj[key]
    if isinstance(v, bool) or not isinstance(v, types) or (isinstance(v, int | float) and not 0 <= v < float("inf")):
        raise TraceFormatError(path, lineno, field, f"expected a {'/'.join(t.__name__ for t in types)} >= 0, got {v!r:.60}")
    return v


class _Session:
    """One line's session read into requests: the walk over its calls and subagents."""

    def __init__(self, path: str, lineno: int, obj: dict, out: list[TraceRequest], root: int) -> None:
        self.path, self.lineno, self.out, self.root = path, lineno, out, root
        self.sid = str(_value(path, lineno, obj, "id", "", (str, int)))
        self.finish: dict[int, float] = {}  # request index -> its recorded finish (t + api_time)
        self.walk(_value(path, lineno, obj, "requests", "", (list,)), [], "requests")

    def walk(self, entries: list, waits_for: list[int], where: str) -> list[int]:
        """Append the stream's calls, the first waiting for ``waits_for``; returns what the stream's end is (its
        last call and the subagents launched after it that someone waits for)."""
        prev, children = waits_for, list[int]()
        for i, e in enumerate(entries):
            at = f"{where}[{i}]"
            kind = e.get("type") if isinstance(e, dict) else None
            if kind in _CALLS:
                prev, children = [self.call(e, prev + children, at)], []
            elif kind == "subagent":
                ends = self.walk(_value(self.path, self.lineno, e, "requests", at, (list,)), prev, f"{at}.requests")
                if e.get("status") != "async_launched":
                    children += ends
            else:
                raise TraceFormatError(self.path, self.lineno, f"{at}.type", f"expected n, s or subagent, got {kind!r:.40}")
        return prev + children

    def call(self, e: dict, after: list[int], at: str) -> int:
        p, n = self.path, self.lineno
        t = float(_value(p, n, e, "t", at, (int, float)))
        api = _value(p, n, e, "api_time", at, (int, float), optional=True)
        think = _value(p, n, e, "think_time", at, (int, float), optional=True)
        ids = _value(p, n, e, "hash_ids", at, (list,))
        if any(isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < _U64 for h in ids):
            raise TraceFormatError(p, n, f"{at}.hash_ids", "expected 64-bit unsigned integers")
        for key in ("model", "stop"):
            _value(p, n, e, key, at, (str,), optional=True)
        k = len(self.out)
        gap = think if think is not None else max(t - max(self.finish[j] for j in after), 0.0) if after else 0.0
        self.out.append(TraceRequest(t, self.sid, 0, chain_ids(ids, self.root), _value(p, n, e, "in", at, (int,)),
                                     _value(p, n, e, "out", at, (int,)), "agent", id=f"{self.sid}#{k}",
                                     after=tuple(self.out[j].id or "" for j in after), gap_s=float(gap)))
        self.finish[k] = t + (api or 0.0)
        return k


def read_sessions(path: str | Path, lines: Iterable[tuple[int, dict]], block_size: int | None = None) -> Trace:
    """Every session of ``lines`` (line number, object) as requests in time order (ties in the file's), each
    session's turns numbered in that order, their dependencies as the module says."""
    p = str(path)
    out: list[TraceRequest] = []
    own: int | None = None
    sessions = 0
    for lineno, obj in lines:
        refuse_other_formats(p, lineno, obj, FORMAT)
        size = _value(p, lineno, obj, "block_size", "", (int,))
        if own is not None and size != own:
            raise TraceFormatError(p, lineno, "block_size", f"{size}, but line 1's sessions have {own}-token blocks")
        own = size
        scope = obj.get("hash_id_scope")
        if scope not in ("local", "global"):
            raise TraceFormatError(p, lineno, "hash_id_scope", f"expected local or global, got {scope!r:.40}")
        root = content_id(FORMAT, str(obj.get("id"))) if scope == "local" else ROOT_HASH
        _Session(p, lineno, obj, out, root)
        sessions += 1
    if not out:
        raise TraceFormatError(p, 0, "file", "empty trace: no requests")
    out.sort(key=lambda r: r.t)
    turns: dict[str, int] = {}
    for r in out:
        r.turn = turns.get(r.session, 0)
        turns[r.session] = r.turn + 1
    meta = {"source_format": FORMAT, "partial_tail_ids": True, "block_size": own, "sessions": sessions}
    return Trace(out, block_size or int(own or 64), p, meta)
