"""The agent trace readers on their shipped samples, every field checked by hand: Dynamo's agentic Mooncake rows
(``wait_for`` -> after, ``delay + tool_wait_ms`` -> gap_s) and SemiAnalysis's Claude Code sessions (calls chained,
subagents fanned out from their parent's call and joined by its next, async ones not waited for)."""

from __future__ import annotations

import json
from importlib.resources import files

import pytest

from loadgen.arrivals import Arrivals
from loadgen.formats import detect_format, read_trace
from shared.errors import TraceFormatError
from shared.hashing import chain_ids, content_id

AGENTIC = str(files("loadgen.data").joinpath("agentic_mooncake_sample.jsonl"))
CC = str(files("loadgen.data").joinpath("cc_traces_sample.jsonl"))


def test_agentic_mooncake_rows_map_to_requests_that_wait():
    assert detect_format(AGENTIC) == "agentic-mooncake"
    trace = read_trace(AGENTIC)
    assert trace.block_size == 512 and trace.meta["partial_tail_ids"]
    got = [(r.id, r.t, r.session, r.turn, r.hash_ids, r.input_tokens, r.output_tokens, r.after, r.gap_s)
           for r in trace.requests]
    assert got == [
        ("r1", 0.0, "root", 0, [0, 1], 1000, 50, (), 0.0),
        ("x1", 0.5, "x1", 0, [9], 300, 10, (), 0.0),  # no session_id: a session of its own
        ("c1", 1.2, "child-a", 0, [0, 2], 600, 20, ("r1",), 0.1),  # delay 100 ms
        ("c2", 1.25, "child-b", 0, [0, 3], 700, 20, ("r1",), 0.15),
        ("c3", 1.3, "child-c", 0, [0, 4], 800, 20, ("r1",), 0.2),
        ("r2", 4.0, "root", 1, [0, 1, 5, 6], 1600, 80, ("r1", "c1", "c2", "c3"), 1.0),  # delay 100 + tool_wait 900
        ("r3", 7.0, "root", 2, [0, 1, 5, 6, 7], 2100, 40, ("r2",), 0.5),
    ]
    assert read_trace(AGENTIC, block_size=64).block_size == 64  # the rows state none: the run's


def test_claude_code_sessions_map_to_calls_subagents_and_joins():
    assert detect_format(CC) == "cc-traces"
    trace = read_trace(CC)
    assert trace.block_size == 64 and trace.meta["sessions"] == 2
    got = [(r.id, r.t, r.session, r.turn, r.input_tokens, r.output_tokens, r.after) for r in trace.requests]
    assert got == [
        ("sess-a#0", 0.0, "sess-a", 0, 640, 20, ()),
        ("sess-b#7", 0.5, "sess-b", 0, 448, 14, ()),
        ("sess-a#1", 3.0, "sess-a", 1, 704, 30, ("sess-a#0",)),
        ("sess-a#2", 5.6, "sess-a", 2, 300, 40, ("sess-a#1",)),  # agent_001's first call, after its spawn
        ("sess-a#4", 5.7, "sess-a", 3, 256, 30, ("sess-a#1",)),  # agent_002, beside it
        ("sess-a#5", 5.8, "sess-a", 4, 128, 10, ("sess-a#1",)),  # agent_003, async_launched
        ("sess-a#3", 7.0, "sess-a", 5, 400, 20, ("sess-a#2",)),
        ("sess-a#6", 9.0, "sess-a", 6, 1024, 50, ("sess-a#1", "sess-a#3", "sess-a#4")),  # the join, not agent_003
    ]
    gaps = {r.id: r.gap_s for r in trace.requests}
    # t minus the latest finish (t + api_time) of what it waits for: 3.0 - 1.5; 5.6 - 5.0; 7.0 - 6.6; 9.0 - 8.2
    assert gaps["sess-a#1"] == 1.5 and gaps["sess-a#2"] == pytest.approx(0.6) and gaps["sess-a#3"] == pytest.approx(0.4)
    assert gaps["sess-a#6"] == pytest.approx(0.8)
    # 64-token block ids, chained after a root of the session's own (hash_id_scope local): equal ids in two
    # sessions are different blocks, a subagent's share its parent's namespace
    first, other = trace.requests[0], trace.requests[1]
    assert first.hash_ids == chain_ids(range(10), content_id("cc-traces", "sess-a"))
    assert other.hash_ids[0] != first.hash_ids[0]
    assert trace.requests[2].hash_ids[:10] == first.hash_ids


def test_the_sample_agent_runs_its_fan_out_in_dependent_arrivals():
    trace = read_trace(AGENTIC)
    arrivals = Arrivals(trace.requests)
    assert [arrivals.pop() for _ in range(2)] == [(0.0, 0), (0.5, 1)]
    arrivals.finished(0, 2.0)
    assert [arrivals.pop()[1] for _ in range(3)] == [2, 3, 4]  # the three children: 2.1, 2.15, 2.2
    for k, end in ((2, 3.0), (3, 5.0), (4, 4.0)):
        arrivals.finished(k, end)
    assert arrivals.pop() == (6.0, 5)  # the last child's 5.0 + 1.0


@pytest.mark.parametrize(("fmt_lines", "lineno", "field"), [
    ([{"request_id": "a", "timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1], "wait_for": ["b"]}],
     1, "wait_for"),
    ([{"request_id": "a", "timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1], "tool_wait_ms": -5,
       "wait_for": []}], 1, "tool_wait_ms"),
    ([{"request_id": "a", "timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]},
      {"request_id": "b", "session": "s", "timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}],
     2, "session"),
    ([{"id": "s", "block_size": 64, "hash_id_scope": "local", "requests": [{"type": "x"}]}], 1, "requests[0].type"),
    ([{"id": "s", "block_size": 64, "hash_id_scope": "local", "requests": [{"type": "n", "t": 0, "in": 1, "out": 1}]}],
     1, "requests[0].hash_ids"),
    ([{"id": "s", "block_size": 64, "hash_id_scope": "local", "requests": []},
      {"id": "u", "block_size": 16, "hash_id_scope": "local", "requests": []}], 2, "block_size"),
    ([{"id": "s", "block_size": 64, "hash_id_scope": "shared", "requests": []}], 1, "hash_id_scope"),
])
def test_bad_agent_lines_name_the_line_and_the_field(tmp_path, fmt_lines, lineno, field):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(obj) + "\n" for obj in fmt_lines))
    with pytest.raises(TraceFormatError) as exc:
        read_trace(path)
    assert (exc.value.line, exc.value.field) == (lineno, field)
