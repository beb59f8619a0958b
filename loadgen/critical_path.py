"""What a user of an agent reads per session (issue 55): the task's end-to-end time and its critical path, for a
live replay (``kvemu replay``) and the simulator alike. Pure: it takes per-request records (``Span``) on one clock.

* **Task time**: the session's first arrival to its last finish.
* **Critical path**: the chain of waits that ends last. It starts at the request that finished last and steps back,
  each time to the request it waited for (``after``) that finished last, the one that released it, until one that
  waited for none. Along it, each request's own time splits into **queue** (arrival to admission), **prefill**
  (admission to its first token) and **decode** (first token to finish), and each step back adds the **tool** time
  between the request it waited for finishing and its own arrival (the trace's ``gap_s``: a tool's run, or a
  subagent's start).
* **Other**: the task time less those four parts, so the five add up to it: the time before the path's first
  request where that is not the session's first (a request that waited for none arrived later), and in a live
  replay what the server's emulated times do not cover (the client's wait for a connection, the network, the
  router); negative where the server's emulated clock runs slower than the wall's (``--time-scale`` below 1).

Only sessions with dependencies count (a request of theirs has ``after``): a session of chained turns has no
dependencies to follow. A session with a request that never finished (it failed, or what it waited for did) has no
task time: it is counted as incomplete. Percentiles are exact, as ``loadgen.request_metrics`` takes them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

import numpy as np

PARTS = ("queue", "prefill", "decode", "tool", "other")  # the critical path's parts, in the order they are drawn


class Span(NamedTuple):
    """One request: its session, name and waits (the trace's), and its times in seconds on one clock; ``finish``
    None where it never finished."""

    session: str
    id: str | None
    after: tuple[str, ...]
    arrival: float
    queue: float
    prefill: float
    decode: float
    finish: float | None


class SessionPath(NamedTuple):
    """One agent session's task time and its critical path's parts (seconds; the parts add up to ``task_s``)."""

    session: str
    task_s: float
    queue_s: float
    prefill_s: float
    decode_s: float
    tool_s: float
    other_s: float
    requests: int  # the session's
    on_path: int  # the requests along its critical path
    widest: int  # the most requests one of its requests waited for (1: no fan-out joined)

    def part(self, name: str) -> float:
        return float(getattr(self, f"{name}_s"))


def session_paths(spans: Iterable[Span]) -> tuple[list[SessionPath], int]:
    """Every finished agent session's path (in session order), and how many agent sessions did not finish."""
    by: dict[str, list[Span]] = {}
    for s in spans:
        by.setdefault(s.session, []).append(s)
    paths, incomplete = [], 0
    for session, group in by.items():
        if not any(s.after for s in group):
            continue
        if any(s.finish is None for s in group):
            incomplete += 1
            continue
        paths.append(_path(session, group))
    return paths, incomplete


def _path(session: str, group: Sequence[Span]) -> SessionPath:
    named = {s.id: s for s in group if s.id is not None}
    last = max(group, key=lambda s: s.finish or 0.0)
    parts = dict.fromkeys(PARTS, 0.0)
    on_path = 0
    node: Span | None = last
    while node is not None:
        on_path += 1
        parts["queue"] += node.queue
        parts["prefill"] += node.prefill
        parts["decode"] += node.decode
        waited = [named[name] for name in node.after if name in named]
        before = max(waited, key=lambda s: s.finish or 0.0) if waited else None
        if before is not None:
            parts["tool"] += node.arrival - (before.finish or 0.0)
        node = before
    task = (last.finish or 0.0) - min(s.arrival for s in group)
    parts["other"] = task - sum(parts[p] for p in PARTS[:-1])
    return SessionPath(session, task, parts["queue"], parts["prefill"], parts["decode"], parts["tool"], parts["other"],
                       len(group), on_path, max((len(s.after) for s in group), default=0))


def summarize_paths(paths: Sequence[SessionPath], incomplete: int = 0) -> dict:
    """p50 and p99 across sessions of the task time and of each part (each its own percentile: the parts' p50s
    need not add up to the task's), with the sessions counted; None where no session finished."""
    out: dict = {"sessions": len(paths), "incomplete": incomplete}
    for name in ("task", *PARTS):
        values = [p.task_s if name == "task" else p.part(name) for p in paths]
        for q in (50, 99):
            out[f"{name}_p{q}_s"] = float(np.percentile(values, q)) if values else None
    return out
