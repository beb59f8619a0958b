"""An agent session's task time and critical path (loadgen/critical_path.py), hand-worked; and kvemu replay's
report of them against a real replica."""

from __future__ import annotations

import json

import pytest

from kvemu.cli import main
from loadgen.critical_path import Span, session_paths, summarize_paths
from loadgen.formats import write_kvemu
from loadgen.trace import Trace, TraceRequest
from shared.hashing import chain_ids, content_id
from tests.support.procs import start_replica

# a/0 fans out to three children, a/1 joins them: the slowest child (a/0.1/0, finished at 9.0) is on the path
SPANS = [
    Span("a", "a/0", (), 0.0, 0.5, 1.0, 2.0, 3.5),
    Span("a", "a/0.0/0", ("a/0",), 4.0, 0.0, 0.5, 1.5, 6.0),
    Span("a", "a/0.1/0", ("a/0",), 5.0, 1.0, 0.5, 2.5, 9.0),
    Span("a", "a/0.2/0", ("a/0",), 3.5, 0.0, 0.5, 0.5, 4.5),
    Span("a", "a/1", ("a/0.0/0", "a/0.1/0", "a/0.2/0"), 11.0, 0.25, 0.75, 3.0, 15.0),
    # b: two turns, the second 1 s of tool time after the first
    Span("b", "b/0", (), 1.0, 0.0, 1.0, 1.0, 3.0),
    Span("b", "b/1", ("b/0",), 4.0, 1.0, 1.0, 2.0, 8.0),
    Span("c", None, (), 0.0, 0.0, 1.0, 1.0, 2.0),  # no dependencies: not an agent session
    Span("d", "d/0", (), 0.0, 0.0, 1.0, 1.0, 2.0), Span("d", "d/1", ("d/0",), 3.0, 0.0, 0.0, 0.0, None),  # failed
]


def test_the_chain_that_ends_last_split_into_its_parts():
    paths, incomplete = session_paths(SPANS)
    assert incomplete == 1
    a, b = paths
    # a: queue 0.25 + 1.0 + 0.5, prefill 0.75 + 0.5 + 1.0, decode 3.0 + 2.5 + 2.0, tool (11 - 9) + (5 - 3.5)
    assert (a.session, a.task_s, a.queue_s, a.prefill_s, a.decode_s, a.tool_s, a.other_s) == \
        ("a", 15.0, 1.75, 2.25, 7.5, 3.5, 0.0)
    assert (a.requests, a.on_path, a.widest) == (5, 3, 3)
    assert (b.task_s, b.queue_s, b.prefill_s, b.decode_s, b.tool_s, b.other_s, b.on_path) == (7.0, 1.0, 2.0, 3.0, 1.0, 0.0, 2)
    summary = summarize_paths(paths, incomplete)
    assert (summary["sessions"], summary["incomplete"], summary["task_p50_s"]) == (2, 1, 11.0)
    assert summary["task_p99_s"] == pytest.approx(7.0 + 0.99 * 8.0) and summary["tool_p50_s"] == 2.25


def test_other_is_what_the_parts_leave_of_the_task():
    # the path's first request arrived 2 s after the session's first: those 2 s are "other"
    spans = [Span("s", "x", (), 0.0, 0.0, 0.5, 0.5, 1.0), Span("s", "y", (), 2.0, 0.0, 1.0, 1.0, 4.0),
             Span("s", "z", ("y",), 5.0, 0.5, 0.5, 1.0, 7.0)]
    (p,), _ = session_paths(spans)
    assert (p.task_s, p.tool_s, p.other_s, p.on_path) == (7.0, 1.0, 2.0, 2)
    assert summarize_paths([])["task_p50_s"] is None


def _req(name, t, turn, after=(), gap=0.0):
    return TraceRequest(t, "agent", turn, chain_ids([content_id("sys", 0), content_id(name, 0)]), 40, 4, "agent",
                        id=name, after=tuple(after), gap_s=gap)


def test_kvemu_replay_reports_each_agent_sessions_task_time(tmp_path, capfd):
    trace = tmp_path / "agent.jsonl"
    write_kvemu(Trace([_req("p", 0.0, 0), _req("c1", 9.0, 1, ["p"], 0.5), _req("c2", 9.0, 2, ["p"], 1.0),
                       _req("j", 9.5, 3, ["c1", "c2"], 2.0)], 16, "hand-made"), trace)
    out = tmp_path / "run.json"
    replica = start_replica(replica_id="r-1")
    try:
        assert main(["replay", "--url", replica.url, "--trace", str(trace), "--speedup", "10", "--json", str(out),
                     "--quiet"]) == 0
    finally:
        replica.stop()
    agents = json.loads(out.read_text())["summary"]["agent_sessions"]
    assert "agent sessions  1 finished" in capfd.readouterr().out  # the fd: a stream another test kept is not ours
    (path,) = agents["paths"]
    assert (path["requests"], path["on_path"], path["widest"]) == (4, 3, 2)
    parts = sum(path[f"{p}_s"] for p in ("queue", "prefill", "decode", "tool", "other"))
    assert parts == pytest.approx(path["task_s"])
    # the tool time on the path is c2's gap (it finishes last of the two) and j's, a tenth each at --speedup 10,
    # plus the moments the replay takes to note each finish
    assert 0.3 <= path["tool_s"] < 0.35 and path["decode_s"] > 0 and agents["task_p50_s"] == path["task_s"]
