"""The dependency fields of a trace's requests, read and checked: ``id`` (the request's name), ``after`` (the
names it waits for) and ``gap_s`` (the tool or think time after the last of them finishes). An agent's next turn
waits for its previous one, a fan-out's children for their parent, a join for every child; ``loadgen.arrivals``
computes the arrivals they imply. Every check names the line and the field: a name given twice, a wait on a
name no line has or on the request itself, a cycle (named at its latest line, the one that closes it, however
far ahead of the lines it waits for), a negative or non-finite gap, a gap with nothing to wait for, and a line
that carries another trace format's fields."""

from __future__ import annotations

import math
from collections.abc import Sequence

from loadgen.trace import TraceRequest
from shared.errors import TraceFormatError

# Fields only one format has: a line of another format that carries one mixes two formats in one file.
FORMAT_FIELDS: dict[str, frozenset[str]] = {
    "kvemu": frozenset({"session", "turn", "after", "gap_s", "kvemu_trace", "prefix"}),
    "mooncake": frozenset({"timestamp", "input_length", "output_length"}),
    "agentic-mooncake": frozenset({"request_id", "wait_for", "tool_wait_ms", "branches", "prefix_reset", "delay"}),
    "cc-traces": frozenset({"requests", "hash_id_scope", "models"}),
    "bailian": frozenset({"chat_id", "parent_chat_id"}),
    "openai": frozenset({"messages", "prompt", "body"}),
    "llmservingsim": frozenset({"input_tok_ids", "arrival_time_ns"}),
}
# The fields a format shares with another (agentic Mooncake rows are Mooncake rows with a workflow layer).
_SHARED = {"agentic-mooncake": FORMAT_FIELDS["mooncake"]}


def _foreign(fmt: str) -> frozenset[str]:
    return frozenset().union(*FORMAT_FIELDS.values()) - FORMAT_FIELDS[fmt] - _SHARED.get(fmt, frozenset())


_FOREIGN = {fmt: _foreign(fmt) for fmt in FORMAT_FIELDS}  # one set test a line


def refuse_other_formats(path: str, lineno: int, obj: dict, fmt: str) -> None:
    """Refuse a line of a ``fmt`` trace that carries a field only another format has."""
    if obj.keys().isdisjoint(_FOREIGN[fmt]):
        return
    name = sorted(obj.keys() & _FOREIGN[fmt])[0]
    other = next(f for f, names in FORMAT_FIELDS.items() if name in names)
    raise TraceFormatError(path, lineno, name, f"is a {other} trace's field in a {fmt} trace (told by its first line):"
                                               " a trace holds one format; convert the lines or split the file")


def request_name(path: str, lineno: int, value, field: str = "id") -> str:
    """A request's name as the trace gives it, a string or an integer, as a string."""
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise TraceFormatError(path, lineno, field, f"expected a request's name (a non-empty string or an integer),"
                                                    f" got {value!r:.60}")
    return str(value)


def waits(path: str, lineno: int, value, field: str = "after") -> tuple[str, ...]:
    """The names a request waits for: a list of names, none twice."""
    if not isinstance(value, list):
        raise TraceFormatError(path, lineno, field, f"expected a list of request names, got {value!r:.60}")
    names = tuple(request_name(path, lineno, v, f"{field}[{i}]") for i, v in enumerate(value))
    if len(set(names)) != len(names):
        twice = next(n for i, n in enumerate(names) if n in names[:i])
        raise TraceFormatError(path, lineno, field, f"names {twice!r:.40} twice")
    return names


def gap_seconds(path: str, lineno: int, value, field: str = "gap_s", scale: float = 1.0) -> float:
    """A gap (tool or think time), a finite number >= 0, times ``scale`` (1e-3 for milliseconds)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise TraceFormatError(path, lineno, field, f"expected a finite number of {'seconds' if scale == 1 else 'ms'}"
                                                    f" >= 0, got {value!r:.60}")
    return float(value) * scale


def dependency_fields(path: str, lineno: int, obj: dict) -> tuple[str | None, tuple[str, ...], float]:
    """A kvemu line's ``id``, ``after`` and ``gap_s`` (None, (), 0.0 where absent)."""
    name = request_name(path, lineno, obj["id"]) if "id" in obj else None
    after = waits(path, lineno, obj["after"]) if "after" in obj else ()
    gap = gap_seconds(path, lineno, obj["gap_s"]) if "gap_s" in obj else 0.0
    if gap and not after:
        raise TraceFormatError(path, lineno, "gap_s", "is the time after the requests in `after` finish, but the line"
                                                      " waits for none: give `after`, or drop gap_s (it arrives at t)")
    if name is not None and name in after:
        raise TraceFormatError(path, lineno, "after", f"the request waits for itself ({name!r:.40})")
    return name, after, gap


def check_dependencies(path: str, requests: Sequence[TraceRequest], linenos: Sequence[int],
                       fields: tuple[str, str] = ("id", "after")) -> None:
    """Refuse a name given twice, a wait on a name no line has, and a cycle, naming the line (``linenos[k]``:
    request k's line in the file) and the field as the format calls it (``fields``: the name's, the waits').
    Linear in the requests and their waits (Kahn's topological order)."""
    name_field, after_field = fields
    line_of: dict[str, int] = {}
    index: dict[str, int] = {}
    for k, r in enumerate(requests):
        if r.id is None:
            continue
        if r.id in index:
            raise TraceFormatError(path, linenos[k], name_field, f"{r.id!r:.40} names line {line_of[r.id]} too: a name"
                                                           " stands for one request")
        index[r.id], line_of[r.id] = k, linenos[k]
    waiting = [0] * len(requests)
    dependents: list[list[int]] = [[] for _ in requests]
    for k, r in enumerate(requests):
        for name in r.after:
            j = index.get(name)
            if j is None:
                raise TraceFormatError(path, linenos[k], after_field, f"waits for {name!r:.40}, which no line of the"
                                                                      f" trace names (its `{name_field}`)")
            dependents[j].append(k)
        waiting[k] = len(r.after)
    ready = [k for k, n in enumerate(waiting) if n == 0]
    done = 0
    while ready:
        k = ready.pop()
        done += 1
        for d in dependents[k]:
            waiting[d] -= 1
            if waiting[d] == 0:
                ready.append(d)
    if done < len(requests):
        _refuse_cycle(path, requests, linenos, index, waiting, after_field)


def _refuse_cycle(path: str, requests: Sequence[TraceRequest], linenos: Sequence[int], index: dict[str, int],
                  waiting: list[int], after_field: str) -> None:
    """Name a cycle among the requests Kahn's order left waiting: each still waits for one of them, so walking
    from any along such waits comes back to a request seen before; the cycle is named at its latest line."""
    k = next(i for i, n in enumerate(waiting) if n > 0)
    seen: dict[int, int] = {}
    walk: list[int] = []
    while k not in seen:
        seen[k] = len(walk)
        walk.append(k)
        k = next(index[name] for name in requests[k].after if waiting[index[name]] > 0)
    cycle = walk[seen[k]:]
    last = max(cycle, key=lambda i: linenos[i])
    names = " -> ".join(repr(requests[i].id) for i in cycle[cycle.index(last):] + cycle[:cycle.index(last) + 1])
    raise TraceFormatError(path, linenos[last], after_field, f"closes a cycle of waits ({names}): no request of it could"
                                                         " ever arrive")
