"""Agentic traffic in virtual time, recorded vs dependent arrivals: the study in docs/agentic.md.

Every point is one `kvemu sim` command line (parsed and checked by its own parser, as bench/bench_pd.py does),
qwen3-coder-30b-a3b with KV sized by --gpu-memory-utilization 0.9 on two clusters, one an H100 per replica and
one an H200 (the GPU presets: the H200's memory bandwidth is 1.4x the H100's and it holds 5x the KV, so it is the
faster cluster on both counts):

  routing    per workload, 8 replicas, `cache_aware` vs `session` vs `round_robin`, `--arrivals recorded` vs
             `dependent`, on each GPU: task time p50 / p99 (an agent session's first arrival to its last finish),
             its critical path's parts, TTFT p50 / p99 and the block hit ratio
  capacity   `cache_aware` on the agent preset with 2, 4 and 8 replicas, both arrival modes, each GPU: the fewest
             replicas whose task time p99 is within 10 % of the same mode's at 8 replicas (the point past which
             more replicas buy the agent's user little), and the fewest whose TTFT p99 meets 2 s (bench_pd.py's
             objective for the agent workload), by each arrival mode

The workloads: the `agent` preset with its fan-outs on (`--set session_rate`, `--duration`), and SemiAnalysis's
Claude Code sample (loadgen/data/cc_traces_sample.jsonl: two sessions, eight calls, one a subagent fan-out) scaled
by replaying its sessions staggered: ``--cc-copies`` copies, copy k starting ``k * --cc-stagger-s`` seconds later,
its session and request ids suffixed and its block hashes salted by k (each copy a separate agent with a cache of
its own, as distinct users' tasks would be; copies of one task sharing their blocks would overstate the hit ratio).

    .venv/bin/python bench/bench_agentic.py --jobs 2 --out docs/agentic-study.json --plots docs
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.study_cli import add_study_flags, known_names, publish, show_saved  # noqa: E402
from kvemu import sim_cmd  # noqa: E402
from loadgen.formats import read_trace, write_kvemu  # noqa: E402
from loadgen.trace import Trace, TraceRequest  # noqa: E402
from sim.run import simulate  # noqa: E402

CC_SAMPLE = Path(__file__).resolve().parents[1] / "loadgen" / "data" / "cc_traces_sample.jsonl"
CLUSTER = "--gpu-memory-utilization 0.9 --reuse off --quiet --jobs 1"
ROUTINGS = ("cache_aware", "session", "round_robin")
ARRIVALS = ("recorded", "dependent")
GPUS = ("h100", "h200")
CAPACITY_REPLICAS = (2, 4, 8)
CAPACITY_SLACK = 1.10  # within 10 % of the task time p99 at the largest cluster
TTFT_P99_S = 2.0  # the agent workload's TTFT objective, bench/bench_pd.py's (chosen there before any run)
KEYS = ("served", "refused", "dependency_failed", "block_hit_ratio", "ttft_p50_s", "ttft_p99_s", "e2e_p99_s",
        "load_imbalance", "saturated")


def scaled_cc(copies: int, stagger_s: float) -> Trace:
    """The Claude Code sample replayed ``copies`` times, copy k ``k * stagger_s`` later (ids suffixed ``~k``,
    hashes salted by k: the prefix structure within a copy kept, nothing shared between copies)."""
    base = read_trace(CC_SAMPLE, "cc-traces")
    out: list[TraceRequest] = []
    for k in range(copies):
        def salt(h: int, k: int = k) -> int:
            return xxhash.xxh3_64_intdigest(h.to_bytes(8, "little"), seed=k)
        out += [dataclasses.replace(r, t=r.t + k * stagger_s, session=f"{r.session}~{k}",
                                    id=None if r.id is None else f"{r.id}~{k}",
                                    after=tuple(f"{a}~{k}" for a in r.after), hash_ids=[salt(h) for h in r.hash_ids])
                for r in base.requests]
    out.sort(key=lambda r: r.t)
    return Trace(out, base.block_size, f"cc-traces sample x{copies} staggered {stagger_s:g} s", dict(base.meta))


def sources(a: argparse.Namespace, folder: str) -> dict[str, str]:
    """Each workload's source flags (the scaled sample written to ``folder``)."""
    cc = os.path.join(folder, "cc_scaled.jsonl")
    write_kvemu(scaled_cc(a.cc_copies, a.cc_stagger_s), cc)
    return {"agent": f"--workload agent --duration {a.duration:g} --set session_rate={a.session_rate:g}"
                     f" --seed {a.seed}",
            "cc-traces": f"--trace {cc}"}


def command_line(source: str, gpu: str, replicas: int, routing: str, arrivals: str) -> list[str]:
    return (f"{source} {CLUSTER} --gpu {gpu} --replicas {replicas} --routing {routing}"
            f" --arrivals {arrivals}").split()


def run_point(point: dict) -> dict:
    """One `kvemu sim` command line's figures: the JSON's agent sessions and the keys above, and each session's
    critical path (``agent_paths``)."""
    p = argparse.ArgumentParser()
    sim_cmd.configure(p)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trace, grid = sim_cmd.runs_of(p.parse_args(point["argv"]))
    run = simulate(trace, grid[0], records=True)
    out: dict[str, Any] = {**{k: v for k, v in point.items() if k != "argv"}, "command": "kvemu sim "
                           + " ".join(point["argv"]), **{k: run.get(k) for k in KEYS}}
    out["agent_sessions"] = run.get("agent_sessions")
    # each session's row only where the critical-path figure draws it (the document stays small)
    keep = point["study"] == "capacity" and point["replicas"] == min(CAPACITY_REPLICAS)
    out["paths"] = [{k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
                    for row in run.get("agent_paths", [])] if keep else []
    out["wall_s"] = run["wall_s"]
    return out


def points(src: dict[str, str], workloads: list[str]) -> list[dict]:
    grid: list[dict[str, Any]] = [{"study": "routing", "workload": w, "gpu": g, "replicas": 8, "routing": r, "arrivals": m}
            for w in workloads for g in GPUS for r in ROUTINGS for m in ARRIVALS]
    if "agent" in workloads:
        grid += [{"study": "capacity", "workload": "agent", "gpu": g, "replicas": n, "routing": "cache_aware",
                  "arrivals": m} for g in GPUS for n in CAPACITY_REPLICAS[:-1] for m in ARRIVALS]
    for pt in grid:
        pt["argv"] = command_line(src[pt["workload"]], pt["gpu"], pt["replicas"], pt["routing"], pt["arrivals"])
    return grid


def capacity(runs: list[dict]) -> list[dict]:
    """Per GPU and arrival mode: task time p99 at each cluster size, and the fewest replicas within
    ``CAPACITY_SLACK`` of the largest cluster's."""
    out = []
    for g in GPUS:
        for m in ARRIVALS:
            mine = {r["replicas"]: r for r in runs
                    if r["workload"] == "agent" and r["routing"] == "cache_aware" and r["gpu"] == g
                    and r["arrivals"] == m and r["agent_sessions"] and r["agent_sessions"]["sessions"]}
            if max(CAPACITY_REPLICAS) not in mine:
                continue
            by = {n: r["agent_sessions"]["task_p99_s"] for n, r in sorted(mine.items())}
            target = by[max(CAPACITY_REPLICAS)] * CAPACITY_SLACK
            fewest = min(n for n, v in by.items() if v <= target)
            ttft = {n: r["ttft_p99_s"] for n, r in sorted(mine.items())}
            out.append({"gpu": g, "arrivals": m, "task_p99_s_by_replicas": by, "target_s": target,
                        "fewest_replicas": fewest, "ttft_p99_s_by_replicas": ttft,
                        "fewest_replicas_ttft": min((n for n, v in ttft.items() if v <= TTFT_P99_S), default=None),
                        "queue_p99_s_by_replicas": {n: r["agent_sessions"]["queue_p99_s"]
                                                    for n, r in sorted(mine.items())}})
    return out


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def tables(doc: dict) -> str:
    lines = ["| workload | GPU | routing | arrivals | task p50 / p99 (s) | tool p50 (s) | queue p99 (s) |"
             " TTFT p50 / p99 (ms) | hit ratio | sessions |", "|" + " --- |" * 10]
    for r in doc["runs"]:
        if r["study"] != "routing":
            continue
        a = r["agent_sessions"] or {}
        lines.append(f"| {r['workload']} | {r['gpu']} | {r['routing']} | {r['arrivals']} |"
                     f" {_s(a.get('task_p50_s'))} / {_s(a.get('task_p99_s'))} | {_s(a.get('tool_p50_s'))} |"
                     f" {_s(a.get('queue_p99_s'))} | {r['ttft_p50_s'] * 1000:,.0f} / {r['ttft_p99_s'] * 1000:,.0f} |"
                     f" {r['block_hit_ratio']:.3f} | {a.get('sessions', 0)} |")
    lines += ["", "| GPU | arrivals | task p99 (s) at 2 / 4 / 8 replicas | target (s) | fewest replicas |"
              f" TTFT p99 (s) at 2 / 4 / 8 | fewest for TTFT p99 <= {TTFT_P99_S:g} s |"
              " path queue p99 (s) at 2 / 4 / 8 |", "|" + " --- |" * 8]
    for c in doc["capacity"]:
        def at(key: str, c: dict = c) -> str:  # JSON read back keys the sizes by strings
            return " / ".join(_s(c[key].get(str(n), c[key].get(n))) for n in CAPACITY_REPLICAS)
        lines.append(f"| {c['gpu']} | {c['arrivals']} | {at('task_p99_s_by_replicas')} | {c['target_s']:,.1f} |"
                     f" {c['fewest_replicas']} | {at('ttft_p99_s_by_replicas')} |"
                     f" {c.get('fewest_replicas_ttft') or f'more than {max(CAPACITY_REPLICAS)}'} |"
                     f" {at('queue_p99_s_by_replicas')} |")
    return "\n".join(lines)


def plot_study(doc: dict, folder: str) -> list[str]:
    from bench.agentic_plots import plot_agentic

    return plot_agentic(doc, folder)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_study_flags(p, "agentic-task-time.png, agentic-capacity.png and agentic-critical-path.png")
    p.add_argument("--workloads", default="agent,cc-traces")
    p.add_argument("--duration", type=float, default=600.0, help="the agent preset's seconds of session starts")
    p.add_argument("--session-rate", type=float, default=0.4, help="the agent preset's new sessions per second")
    p.add_argument("--cc-copies", type=int, default=300)
    p.add_argument("--cc-stagger-s", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if show_saved(a, tables, plot_study):
        return 0
    workloads = known_names(p, "--workloads", a.workloads, ("agent", "cc-traces"))
    with tempfile.TemporaryDirectory() as folder:
        grid = points(sources(a, folder), workloads)
        with ProcessPoolExecutor(max(1, a.jobs)) as pool:
            runs = list(pool.map(run_point, grid))
    for r in runs:  # the scaled sample's path is a temporary file: say what it was
        r["command"] = r["command"].replace(os.path.join(folder, "cc_scaled.jsonl"), "CC_SCALED.jsonl")
    doc = {"settings": {k: getattr(a, k) for k in ("workloads", "duration", "session_rate", "cc_copies",
                                                    "cc_stagger_s", "seed")},
           "cc_scaled": "CC_SCALED.jsonl: bench_agentic.scaled_cc(cc_copies, cc_stagger_s) written by write_kvemu",
           "runs": runs, "capacity": capacity(runs)}
    print(tables(doc), file=sys.stderr)
    publish(a, doc, plot_study)
    return 0


if __name__ == "__main__":
    sys.exit(main())
