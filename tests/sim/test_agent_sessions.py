"""``kvemu sim``'s agent sessions (loadgen/critical_path.py, the function the live replay reports with) on the
hand-worked agent trace (tests/support/agent_trace.py): each session's task time and its critical path's parts,
exact on the simulated clock; the JSON's p50/p99, the table's line and ``--sessions-out``."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kvemu.cli import main
from loadgen.formats import write_kvemu
from loadgen.trace import Trace
from tests.support.agent_trace import AGENT, GPU, MODEL, simulate_by_hand


def test_task_time_and_critical_path_by_hand():
    run = simulate_by_hand(AGENT)
    rec = {AGENT[r.index].id: r for r in run["request_records"]}
    paths = {p["session"]: p for p in run["agent_paths"]}
    # agent: t2 waits for t1 (gap 1.0): the path is t2 <- t1, its tool time the gap
    t1, t2 = rec["t1"], rec["t2"]
    a = paths["agent"]
    assert a["task_s"] == t2.finish_s - 0.0
    assert a["tool_s"] == t2.arrival_s - t1.finish_s == pytest.approx(1.0, abs=1e-12)
    assert a["prefill_s"] + a["queue_s"] == pytest.approx(t1.ttft_s + t2.ttft_s, abs=1e-12)
    assert a["decode_s"] == pytest.approx((t1.finish_s - t1.first_token_s) + (t2.finish_s - t2.first_token_s),
                                          abs=1e-12)
    assert a["other_s"] == pytest.approx(0.0, abs=1e-12)  # the path starts at the session's first arrival
    assert (a["requests"], a["on_path"], a["widest"]) == (2, 2, 1)
    # fan: j joins c1, c2, c3 (gaps 0.5, 0, 0.25 after p); c1 arrives last and, as long as the others, ends last
    f = paths["fan"]
    assert max(("c1", "c2", "c3"), key=lambda n: rec[n].finish_s) == "c1"
    assert f["task_s"] == pytest.approx(rec["j"].finish_s - 0.2, abs=1e-12)
    assert f["tool_s"] == pytest.approx(0.5 + 2.0, abs=1e-12)
    path = [rec[n] for n in ("p", "c1", "j")]
    assert f["queue_s"] + f["prefill_s"] + f["decode_s"] == pytest.approx(sum(r.e2e_s for r in path), abs=1e-12)
    assert (f["requests"], f["on_path"], f["widest"]) == (5, 3, 3)
    # the JSON's summary: two sessions, p50 their mean, p99 near the larger
    s = run["agent_sessions"]
    assert (s["sessions"], s["incomplete"]) == (2, 0)
    assert s["task_p50_s"] == pytest.approx((a["task_s"] + f["task_s"]) / 2, rel=1e-12)
    assert s["tool_p99_s"] == pytest.approx(1.0 + 0.99 * 1.5, rel=1e-12)


def test_recorded_arrivals_wait_for_the_trace_times():
    # recorded: t2 arrives at 9.0 whatever t1's finish, so its tool time is what the cluster left of the 9 s
    run = simulate_by_hand(AGENT, arrivals="recorded")
    t1 = next(r for r in run["request_records"] if AGENT[r.index].id == "t1")
    a = next(p for p in run["agent_paths"] if p["session"] == "agent")
    assert a["tool_s"] == pytest.approx(9.0 - t1.finish_s, abs=1e-12)


def test_a_trace_without_dependencies_has_no_agent_sessions():
    run = simulate_by_hand([dataclasses.replace(r, after=(), gap_s=0.0) for r in AGENT])
    assert "agent_sessions" not in run and "agent_paths" not in run


def test_the_table_line_and_sessions_out(tmp_path, capsys):
    trace = tmp_path / "agent.jsonl"
    write_kvemu(Trace(AGENT, 16, "hand-made"), trace)
    out = tmp_path / "sessions.jsonl"
    assert main(["sim", "--trace", str(trace), "--model", MODEL, "--gpu", GPU, "--capacity-blocks", "64",
                 "--sessions-out", str(out), "--quiet"]) == 0
    table = capsys.readouterr().out
    assert "agent sessions 2 (0 incomplete): task time s p50/p99" in table
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["session"] for r in rows] == ["agent", "fan"] and rows[1]["widest"] == 3
