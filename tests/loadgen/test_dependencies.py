"""The dependency fields of a kvemu trace (``id``, ``after``, ``gap_s``): read, written back, and every bad input
refused in one line naming the line and the field."""

from __future__ import annotations

import json
import math

import pytest

from loadgen.dependencies import gap_seconds
from loadgen.formats import read_trace, write_kvemu
from loadgen.trace import has_dependencies
from shared.errors import TraceFormatError


def line(name, t=0.0, session="s", turn=0, **fields):
    rec = {"t": t, "session": session, "turn": turn, "hash_ids": [turn + 1], "input_tokens": 16, "output_tokens": 2}
    if name is not None:
        rec["id"] = name
    return {**rec, **fields}


def write(tmp_path, lines, name="t.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    return path


def test_the_fields_are_read_and_written_back(tmp_path):
    path = write(tmp_path, [line("p"), line(1, t=4.0, turn=1, after=["p"], gap_s=1.5),
                            line("j", t=9.0, turn=2, after=["p", 1])])
    trace = read_trace(path, "kvemu")
    assert [(r.id, r.after, r.gap_s) for r in trace.requests] == [("p", (), 0.0), ("1", ("p",), 1.5),
                                                                 ("j", ("p", "1"), 0.0)]
    assert has_dependencies(trace)
    back = tmp_path / "back.jsonl"
    write_kvemu(trace, back)
    again = read_trace(back, "kvemu")
    assert [(r.id, r.after, r.gap_s) for r in again.requests] == [(r.id, r.after, r.gap_s) for r in trace.requests]


def test_a_wait_on_a_later_line_is_fine_without_a_cycle(tmp_path):
    trace = read_trace(write(tmp_path, [line("a", after=["b"]), line("b", t=1.0, turn=1)]), "kvemu")
    assert trace.requests[0].after == ("b",)


@pytest.mark.parametrize(("lines", "lineno", "field", "says"), [
    ([line("a"), line("b", turn=1, after=["zz"])], 2, "after", "'zz', which no line"),
    ([line("a", after=["a"])], 1, "after", "waits for itself"),
    ([line("a"), line("a", turn=1)], 2, "id", "names line 1 too"),
    # a -> c -> b -> a: named at line 3, the latest of the cycle, though line 1 waits for a later line
    ([line("a", after=["c"]), line("b", turn=1, after=["a"]), line("c", turn=2, after=["b"])], 3, "after",
     "closes a cycle"),
    ([line("a"), line("b", turn=1, after=["a"], gap_s=-1)], 2, "gap_s", "finite number"),
    ([line("a"), line("b", turn=1, after=["a"], gap_s="1")], 2, "gap_s", "finite number"),
    ([line("a", gap_s=2.0)], 1, "gap_s", "waits for none"),
    ([line("a"), line("b", turn=1, after="a")], 2, "after", "a list of request names"),
    ([line("a"), line("b", turn=1, after=["a", "a"])], 2, "after", "twice"),
    ([line(True)], 1, "id", "a request's name"),
    ([line("a"), line("b", turn=1, wait_for=["a"])], 2, "wait_for", "agentic-mooncake trace's field in a kvemu"),
    ([line("a"), line("b", turn=1, timestamp=5)], 2, "timestamp", "mooncake trace's field"),
])
def test_bad_dependencies_name_the_line_and_the_field(tmp_path, lines, lineno, field, says):
    with pytest.raises(TraceFormatError, match=says) as exc:
        read_trace(write(tmp_path, lines), "kvemu")
    assert (exc.value.line, exc.value.field) == (lineno, field)


def test_a_gap_that_is_not_a_number_is_refused():
    assert gap_seconds("f", 1, 250, "tool_wait_ms", 1e-3) == 0.25
    for bad in (math.nan, math.inf, -0.5):
        with pytest.raises(TraceFormatError, match="finite"):
            gap_seconds("f", 1, bad)
