"""bench/bench_agentic.py: the Claude Code sample scaled by staggered copies (exact), one point of the study run
through its `kvemu sim` command line, the capacity rule worked by hand, and --from on a saved document."""

from __future__ import annotations

import json

from bench import bench_agentic as ba
from loadgen.formats import read_trace, write_kvemu


def test_staggered_copies_of_the_cc_sample():
    base = read_trace(ba.CC_SAMPLE, "cc-traces")
    scaled = ba.scaled_cc(3, 2.5)
    assert len(scaled.requests) == 3 * len(base.requests) and scaled.block_size == base.block_size == 64
    by_id = {r.id: r for r in scaled.requests}
    for r in base.requests:
        for k in range(3):
            c = by_id[f"{r.id}~{k}"]
            assert (c.t, c.session, c.after, c.gap_s, c.input_tokens) == (
                r.t + 2.5 * k, f"{r.session}~{k}", tuple(f"{a}~{k}" for a in r.after), r.gap_s, r.input_tokens)
            assert len(c.hash_ids) == len(r.hash_ids)
    # within a copy, the sample's shared prefixes stay shared; between copies nothing is
    first = [set(h for r in scaled.requests if r.session.endswith(f"~{k}") for h in r.hash_ids) for k in range(3)]
    assert not first[0] & first[1] and not first[1] & first[2]
    a0, a1 = by_id["sess-a#0~0"].hash_ids, by_id["sess-a#1~0"].hash_ids
    assert a1[:len(a0)] == a0


def test_one_point_and_its_agent_sessions(tmp_path):
    path = tmp_path / "cc.jsonl"
    write_kvemu(ba.scaled_cc(2, 1.0), path)
    run = ba.run_point({"study": "capacity", "workload": "cc-traces", "gpu": "h200", "replicas": 2,
                        "routing": "session", "arrivals": "dependent",
                        "argv": ba.command_line(f"--trace {path}", "h200", 2, "session", "dependent")})
    assert run["command"].startswith("kvemu sim --trace") and "--arrivals dependent" in run["command"]
    # sess-b is one call, waiting for nothing: one agent session a copy
    assert run["served"] == 16 and run["agent_sessions"]["sessions"] == 2 and len(run["paths"]) == 2
    for p in run["paths"]:  # the parts add up to the task time
        total = sum(p[f"{k}_s"] for k in ("queue", "prefill", "decode", "tool", "other"))
        assert abs(total - p["task_s"]) < 1e-3


def _run(gpu, mode, n, task, ttft):
    return {"study": "capacity", "workload": "agent", "routing": "cache_aware", "gpu": gpu, "arrivals": mode,
            "replicas": n, "ttft_p99_s": ttft, "agent_sessions": {"sessions": 5, "task_p99_s": task, "queue_p99_s": 0.0}}


def test_capacity_rule_and_from(tmp_path, capsys):
    runs = [_run("h100", "recorded", 2, 100.0, 9.0), _run("h100", "recorded", 4, 90.0, 3.0),
            _run("h100", "recorded", 8, 85.0, 0.5),
            _run("h100", "dependent", 2, 130.0, 2.0), _run("h100", "dependent", 4, 100.0, 1.0),
            _run("h100", "dependent", 8, 93.0, 0.5)]
    cap = ba.capacity(runs)
    # recorded: 85 x 1.1 = 93.5, met at 4 (90); dependent: 93 x 1.1 = 102.3, met at 4 (100)
    assert [(c["arrivals"], c["fewest_replicas"]) for c in cap] == [("recorded", 4), ("dependent", 4)]
    assert abs(cap[0]["target_s"] - 93.5) < 1e-9
    # TTFT p99 <= 2 s: recorded only at 8 (0.5), dependent at 2 already (2.0)
    assert [c["fewest_replicas_ttft"] for c in cap] == [8, 2]
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps({"runs": runs, "capacity": cap}))
    assert ba.main(["--from", str(doc)]) == 0
    assert "| h100 | recorded | 100.0 / 90.0 / 85.0 | 93.5 | 4 | 9.0 / 3.0 / 0.5 | 8 |" in capsys.readouterr().out
