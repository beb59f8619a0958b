"""Disaggregated prefill / decode in virtual time: the study in docs/pd.md.

Every point is one `kvemu sim` command line (parsed and checked by its own parser, as
bench/bench_flashgen.py does), on kvemu's default model and GPU (qwen3-coder-30b-a3b on one H200 per
instance, KV sized by --gpu-memory-utilization 0.9), four GPUs in every configuration:

  goodput   per workload (the chat and agent presets, the shipped Mooncake conversation trace) and per
            configuration (colocated x4, and 1P:3D, 2P:2D, 3P:1D, each with llm-d's prefix decider, the
            default, and with `--pd-decider always`): the highest arrival rate whose TTFT p99 and TPOT p99
            meet the workload's objectives (``WORKLOADS``) and whose queue stays bounded, found by doubling
            then bisection of the rate (a preset's session_rate; the trace's timestamps divided by a factor)
  link      2P:2D on the Mooncake trace with every NIC at 25, 50, 100 and 400 Gb/s (--pd-link-gbps): the
            goodput, and at one load (2P:2D's goodput at the default 400 Gb/s) the TTFT split
  routing   `--prefill-routing cache_aware` vs `round_robin` on 2P:2D at that configuration's goodput load,
            per workload and decider: the prefill pool's hit ratio and TTFT
  estimate  the mean-field LRU estimate (`kvemu estimate`, sim/estimate.py) against `kvemu sim` with ONE
            prefill instance and `--pd-decider always` on the scm preset (the analysis's own conversation
            model and its setting: one prefiller whose HBM is the cache, response KV not stored), the
            prefill pool's steady-state block hit ratio at several capacities, and the colocated
            `--response-kv drop` replica beside it (bench/validate_estimate.py's measurement)

A preset's trace is cut at --duration (the drain of sessions still running after it is dropped, so the
offered rate is the one named), a rate's requests/s is the requests kept over the window. The JSON
(stdout, or --out FILE) keeps every point tried; --plots DIR draws docs/pd-*.png (sim/pd_plots.py).

    .venv/bin/python bench/bench_pd.py --jobs 2 --out docs/pd/bench_pd.json --plots docs
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.study_cli import add_study_flags, known_names, publish, show_saved  # noqa: E402
from kvemu import sim_cmd  # noqa: E402
from loadgen.trace import Trace, TraceRequest  # noqa: E402
from shared.progress import ProgressBar  # noqa: E402
from sim.estimate import ScmModel, estimate  # noqa: E402
from sim.pd_plots import plot_study  # noqa: E402
from sim.run import simulate  # noqa: E402

GPUS = 4
# The cluster every point shares (the model and GPU: kvemu's defaults, qwen3-coder-30b-a3b on H200).
CLUSTER = "--gpu-memory-utilization 0.9 --reuse off --quiet --jobs 1"
CONFIGS = {
    "colocated": "--replicas 4",
    "1P:3D": "--replicas 0 --prefill-replicas 1 --decode-replicas 3",
    "2P:2D": "--replicas 0 --prefill-replicas 2 --decode-replicas 2",
    "3P:1D": "--replicas 0 --prefill-replicas 3 --decode-replicas 1",
    "1P:3D always": "--replicas 0 --prefill-replicas 1 --decode-replicas 3 --pd-decider always",
    "2P:2D always": "--replicas 0 --prefill-replicas 2 --decode-replicas 2 --pd-decider always",
    "3P:1D always": "--replicas 0 --prefill-replicas 3 --decode-replicas 1 --pd-decider always",
}
# Per workload: where its requests come from, what its rate is, where the search starts and the objectives.
# The objectives are p99 over every request of the window, chosen before any run from each workload's
# prompt lengths (chat: hundreds of tokens; agent: a 3,000-token system prompt and growing tool output;
# Mooncake: 12,000 tokens on average, up to 126,000): TTFT p99 <= 1, 2 and 10 s; TPOT p99 (time per output
# token after the first, vLLM's TPOT, the ITL's mean per request) <= 50 ms for the interactive presets
# (20 tokens/s, faster than reading) and 100 ms for Mooncake (the tightest TBT objective of the Mooncake paper).
WORKLOADS: dict[str, dict[str, Any]] = {
    "chat": {"source": "--workload chat", "rate": "session_rate", "unit": "sessions/s", "start": 4.0,
             "ttft_p99_s": 1.0, "tpot_p99_s": 0.05},
    # (measured before the agent preset fanned out: its turns follow one another)
    "agent": {"source": "--workload agent --set tool_fanout_prob=0 --set subagent_prob=0", "rate": "session_rate",
              "unit": "sessions/s", "start": 0.1,
              "ttft_p99_s": 2.0, "tpot_p99_s": 0.05},
    "mooncake": {"source": "--trace mooncake-conversation", "rate": "speedup", "unit": "x the trace's rate",
                 "start": 0.25, "ttft_p99_s": 10.0, "tpot_p99_s": 0.1},
}
LINK_GBPS = (25.0, 50.0, 100.0, 400.0)
LINK_WORKLOAD, LINK_CONFIG = "mooncake", "2P:2D"
ROUTING_CONFIGS = ("2P:2D", "2P:2D always")
# The scm preset's own parameters (the analysis's: lambda 0.3 /s, E[W] 135 s, p 0.8, 8 + 16 blocks a turn).
ESTIMATE_CAPACITIES = (2000, 4000, 8000, 16000, 32000)
ESTIMATE_DECODE_GIB = 60.0  # the decode instance's KV: large, so that it never fails over (it holds every session)
KEYS = ("requests", "served", "refused", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "throughput_rps",
        "token_hit_ratio", "preemptions", "saturated")
PD_KEYS = ("requests", "ttft_split", "transfer_tokens", "transfer_bytes", "saved_tokens")


# ---------------------------------------------------------------- one point


def command_line(workload: str, config: str, rate: float, opts: dict, extra: str = "") -> list[str]:
    """The `kvemu sim` arguments of one point (for the Mooncake trace the rate is applied to the trace
    after reading it: no flag of `kvemu sim` rescales a trace's time)."""
    w = WORKLOADS[workload]
    argv = w["source"].split()
    if w["rate"] == "session_rate":
        argv += ["--duration", str(opts["duration"]), "--set", f"session_rate={rate:.6g}"]
    argv += ["--seed", str(opts["seed"]), *CLUSTER.split(), *CONFIGS[config].split(), *extra.split()]
    return argv


def build(argv: list[str]):
    p = argparse.ArgumentParser()
    sim_cmd.configure(p)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trace, grid = sim_cmd.runs_of(p.parse_args(argv))  # the capacity line each run prints: not here
    return trace, grid[0]


def shaped(trace: Trace, workload: str, rate: float, opts: dict) -> tuple[Trace, float]:
    """The requests a point runs and the window they arrive in: a preset cut at its duration (its drain
    dropped), the trace's timestamps divided by ``rate``."""
    if WORKLOADS[workload]["rate"] == "session_rate":
        kept = [r for r in trace.requests if r.t < opts["duration"]]
        return Trace(kept, trace.block_size, trace.source, trace.meta), opts["duration"]
    t0 = trace.requests[0].t
    reqs = [TraceRequest(t0 + (r.t - t0) / rate, r.session, r.turn, r.hash_ids, r.input_tokens, r.output_tokens,
                         r.kind) for r in trace.requests]
    return Trace(reqs, trace.block_size, trace.source, trace.meta), (reqs[-1].t - t0) or 1.0


def run_point(workload: str, config: str, rate: float, opts: dict, extra: str = "") -> dict:
    trace, settings = build(command_line(workload, config, rate, opts, extra))
    trace, window = shaped(trace, workload, rate, opts)
    run = simulate(trace, settings)
    w = WORKLOADS[workload]
    out: dict[str, Any] = {k: run.get(k) for k in KEYS}
    out.update(rate=rate, rps=round(len(trace.requests) / window, 4), wall_s=run["wall_s"])
    out["meets"] = bool(not run["saturated"] and run["served"] > 0
                        and run["ttft_p99_s"] is not None and run["ttft_p99_s"] <= w["ttft_p99_s"]
                        and run["tpot_p99_s"] is not None and run["tpot_p99_s"] <= w["tpot_p99_s"])
    pd = run.get("pd")
    if pd:
        out["pd"] = {k: pd[k] for k in PD_KEYS}
        out["pd"]["pools"] = {role: {k: round(v, 5) if isinstance(v, float) else v for k, v in pool.items()}
                              for role, pool in pd["pools"].items()}
        links = pd["links"]
        out["pd"]["busiest_link_utilization"] = max((x["utilization"] for x in links.values()), default=0.0)
    return out


# ---------------------------------------------------------------- the searches


def search(workload: str, config: str, opts: dict, extra: str = "", tick=None) -> dict:
    """Double the rate from the workload's start until the objectives fail, then bisect ``steps``
    times: the highest rate met (every point tried is kept)."""
    points, rate, best = [], WORKLOADS[workload]["start"] * opts["start_scale"], None
    for _ in range(opts["doublings"] + 1):
        pt = run_point(workload, config, rate, opts, extra)
        points.append(pt)
        if tick:
            tick()
        if not pt["meets"]:
            break
        best, rate = pt, rate * 2
    else:
        return {"best": best, "points": points, "capped": True}  # met at the highest rate tried
    lo, hi = (best["rate"] if best else 0.0), rate
    for _ in range(opts["steps"]):
        mid = (lo + hi) / 2
        pt = run_point(workload, config, mid, opts, extra)
        points.append(pt)
        if tick:
            tick()
        if pt["meets"]:
            best, lo = pt, mid
        else:
            hi = mid
    return {"best": best, "points": points, "capped": False}


def estimate_point(capacity: int, mode: str, opts: dict) -> dict:
    """The steady-state block hit ratio of the cache that the mean-field model describes: the prefill
    instance's (``pd``) or the colocated replica's with response KV dropped (``colocated``), measured on
    [warm-up, end) by subtracting a run cut at the warm-up (bench/validate_estimate.py's method)."""
    model = ScmModel()  # the preset's defaults: the analysis's parameters
    warmup = max(600.0, 5 * model.think_mean * model.continue_prob / (1 - model.continue_prob))
    end = warmup + opts["estimate_sessions"] / model.arrival_rate
    flags = (["--replicas", "0", "--prefill-replicas", "1", "--decode-replicas", "1", "--pd-decider", "always",
              "--decode-capacity-gib", str(ESTIMATE_DECODE_GIB)] if mode == "pd"
             else ["--replicas", "1", "--response-kv", "drop"])
    argv = ["--workload", "scm", "--duration", str(end), "--seed", str(opts["seed"]), "--policy", "session_lru",
            "--capacity-blocks", str(capacity), "--reuse", "off", "--quiet", "--jobs", "1", *flags]
    trace, settings = build(argv)

    def counts(until: float) -> tuple[int, int, dict]:
        run = simulate(Trace([r for r in trace.requests if r.t < until], trace.block_size, trace.source, trace.meta),
                       settings)
        rep = next(r for r in run["per_replica"] if r["replica"] in ("prefill-0", "replica-0"))
        return rep["block_hits"], rep["block_accesses"], run

    h1, a1, run = counts(end)
    h0, a0, _ = counts(warmup)
    est = estimate(model.workload(), capacity)
    out: dict[str, Any] = {"capacity_blocks": capacity, "mode": mode, "estimate": round(est.hit_ratio, 5),
           "sim_steady": round((h1 - h0) / (a1 - a0), 5), "sim_whole": round(h1 / a1, 5),
           "window_s": [warmup, end], "window_accesses": a1 - a0, "command": "kvemu sim " + " ".join(argv)}
    out["difference"] = round(out["sim_steady"] - out["estimate"], 5)
    if mode == "pd":
        out["failover"] = run["pd"]["requests"]["failover"]
        out["remote"] = run["pd"]["requests"]["remote"]
    return out


# ---------------------------------------------------------------- running many at once

_TICKS = None


def _init(queue) -> None:
    global _TICKS
    _TICKS = queue


def _tick() -> None:
    if _TICKS is not None:
        _TICKS.put(1)


def _task(kind: str, args: tuple) -> tuple[str, tuple, dict]:
    if kind == "search":
        workload, config, opts, *extra = args
        return kind, args, search(workload, config, opts, extra[0] if extra else "", tick=_tick)
    out = run_point(*args) if kind == "point" else estimate_point(*args)
    _tick()
    return kind, args, out


def run_tasks(tasks: list[tuple[str, tuple, int]], jobs: int, label: str) -> list[tuple[str, tuple, dict]]:
    """Tasks ``(kind, args, points it may run)`` on ``jobs`` processes, longest first; progress over
    points with an ETA (its total is the searches' most: it finishes early when they stop sooner)."""
    import multiprocessing

    total = sum(n for _, _, n in tasks)
    bar = ProgressBar(label, total, "pt")
    out = []
    with multiprocessing.Manager() as manager:
        queue = manager.Queue()
        with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(tasks))), initializer=_init,
                                 initargs=(queue,)) as pool:
            pending = {pool.submit(_task, kind, args) for kind, args, _ in sorted(tasks, key=lambda t: -t[2])}
            while pending:
                done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                while not queue.empty():
                    queue.get()
                    bar.update()
                for fut in done:
                    out.append(fut.result())
        while not queue.empty():
            queue.get()
            bar.update()
    bar.update_to(total)
    bar.close()
    return out


# ---------------------------------------------------------------- the document


def summary(chain: dict) -> dict:
    best = chain["best"]
    doc = {"goodput_rps": best["rps"] if best else 0.0, "rate": best["rate"] if best else 0.0,
           "capped": chain["capped"], "at_goodput": best}
    doc["points"] = [{k: p[k] for k in ("rate", "rps", "ttft_p99_s", "tpot_p99_s", "saturated", "meets")}
                     for p in sorted(chain["points"], key=lambda p: p["rate"])]
    return doc


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:,.0f}" if x >= 0.01 else f"{x * 1000:.1f}"


def tables(doc: dict) -> str:
    """The document's results as markdown tables (what docs/pd.md shows)."""
    out: list[str] = []
    if doc.get("goodput"):
        names = list(next(iter(doc["goodput"].values())))
        out += ["| workload (objectives) | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for w, by in doc["goodput"].items():
            o = doc["objectives"][w]
            cells = [f"{by[n]['goodput_rps']:.3g}{'+' if by[n]['capped'] else ''}" if n in by else "-" for n in names]
            out.append(f"| {w} (TTFT p99 <= {o['ttft_p99_s']:g} s, TPOT p99 <= {o['tpot_p99_s'] * 1000:g} ms) | "
                       + " | ".join(cells) + " |")
        out += ["", "| workload | configuration | rate | req/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms | hit ratio"
                " | remote / local / failover | TTFT split p50 ms: queue, prefill, transfer, first decode |",
                "|---|---|---|---|---|---|---|---|---|"]
        for w, by in doc["goodput"].items():
            for n, g in by.items():
                a = g["at_goodput"]
                if not a:
                    out.append(f"| {w} | {n} | none met | | | | | | |")
                    continue
                pd = a.get("pd")
                req = f"{pd['requests']['remote']:,} / {pd['requests']['local']:,} / {pd['requests']['failover']:,}" \
                    if pd else "-"
                split = ", ".join(_ms(pd["ttft_split"][f"{k}_p50_s"]) for k in ("queue", "prefill", "transfer",
                                                                                  "first_decode")) if pd else "-"
                out.append(f"| {w} | {n} | {a['rate']:.4g} | {a['rps']:.3g} | {_ms(a['ttft_p50_s'])} / "
                           f"{_ms(a['ttft_p99_s'])} | {_ms(a['tpot_p50_s'])} / {_ms(a['tpot_p99_s'])} | "
                           f"{a['token_hit_ratio']:.3f} | {req} | {split} |")
    if doc.get("link"):
        link = doc["link"]
        out += ["", f"Link ({link['config']}, {link['workload']}; split at rate {link['rate']}):", "",
                "| NIC Gb/s | goodput req/s | TTFT p50 / p99 ms | transfer p50 / p99 ms | prefill p50 / p99 ms"
                " | queue p50 / p99 ms | busiest NIC busy |", "|---|---|---|---|---|---|---|"]
        for g, v in link["gbps"].items():
            a, gp = v["at_rate"], v["goodput"]
            sp = a["pd"]["ttft_split"] if a else {}
            out.append(f"| {g} | {gp['goodput_rps'] if gp else '-'} | "
                       + (f"{_ms(a['ttft_p50_s'])} / {_ms(a['ttft_p99_s'])} | "
                          f"{_ms(sp['transfer_p50_s'])} / {_ms(sp['transfer_p99_s'])} | "
                          f"{_ms(sp['prefill_p50_s'])} / {_ms(sp['prefill_p99_s'])} | "
                          f"{_ms(sp['queue_p50_s'])} / {_ms(sp['queue_p99_s'])} | "
                          f"{a['pd']['busiest_link_utilization']:.1%} |" if a else "- | - | - | - | - |"))
    if doc.get("routing"):
        out += ["", "| workload | configuration | rate | prefill routing | prefill pool token hit | TTFT p50 / p99 ms"
                " | TPOT p99 ms | meets |", "|---|---|---|---|---|---|---|---|"]
        for w, by in doc["routing"].items():
            for c, v in by.items():
                for r in ("cache_aware", "round_robin"):
                    a = v[r]
                    out.append(f"| {w} | {c} | {v['rate']:.4g} | {r} | "
                               f"{a['pd']['pools']['prefill']['token_hit_ratio']:.3f} | {_ms(a['ttft_p50_s'])} / "
                               f"{_ms(a['ttft_p99_s'])} | {_ms(a['tpot_p99_s'])} | {a['meets']} |")
    if doc.get("estimate"):
        out += ["", "| capacity (blocks) | estimate | 1 prefill instance (sim) | difference | colocated, response KV"
                " dropped (sim) | difference |", "|---|---|---|---|---|---|"]
        pts = {(p["mode"], p["capacity_blocks"]): p for p in doc["estimate"]["points"]}
        for cap in sorted({c for _, c in pts}):
            pd, co = pts.get(("pd", cap)), pts.get(("colocated", cap))
            est = (pd or co or {}).get("estimate")
            out.append(f"| {cap:,} | {est:.4f} | "
                       + (f"{pd['sim_steady']:.4f} | {pd['difference']:+.4f} | " if pd else "- | - | ")
                       + (f"{co['sim_steady']:.4f} | {co['difference']:+.4f} |" if co else "- | - |"))
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: chat, agent, mooncake")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated names of CONFIGS")
    p.add_argument("--parts", default="goodput,link,routing,estimate", help="which parts of the study to run")
    p.add_argument("--duration", type=float, default=300.0, help="seconds of a preset's sessions per point")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--start-scale", type=float, default=1.0, help="scales every workload's first rate tried")
    p.add_argument("--doublings", type=int, default=5, help="most doublings of the rate before bisecting")
    p.add_argument("--steps", type=int, default=3, help="bisection steps after the doubling")
    p.add_argument("--estimate-sessions", type=int, default=10_000,
                   help="scm sessions arriving in each estimate point's steady window")
    p.add_argument("--estimate-capacities", default=",".join(map(str, ESTIMATE_CAPACITIES)))
    add_study_flags(p, "pd-*.png")
    a = p.parse_args(argv)
    if show_saved(a, tables, plot_study):
        return 0
    workloads = known_names(p, "--workloads", a.workloads, WORKLOADS)
    configs = known_names(p, "--configs", a.configs, CONFIGS)
    parts = set(known_names(p, "--parts", a.parts, ("goodput", "link", "routing", "estimate")))
    opts = {"duration": a.duration, "seed": a.seed, "start_scale": a.start_scale, "doublings": a.doublings,
            "steps": a.steps, "estimate_sessions": a.estimate_sessions}
    per_search = a.doublings + 1 + a.steps
    t0 = time.perf_counter()

    # phase 1: the searches (goodput per configuration, goodput per link speed) and the estimate points
    tasks: list[tuple[str, tuple, int]] = []
    if parts & {"goodput", "link", "routing"}:
        need = set(configs) if "goodput" in parts else set()
        if "link" in parts and LINK_WORKLOAD in workloads:
            need.add(LINK_CONFIG)
        if "routing" in parts:
            need |= set(ROUTING_CONFIGS)
        tasks += [("search", (w, c, opts), per_search) for w in workloads for c in CONFIGS if c in need]
    if "link" in parts and LINK_WORKLOAD in workloads:
        tasks += [("search", (LINK_WORKLOAD, LINK_CONFIG, opts, f"--pd-link-gbps {g:g}"), per_search)
                  for g in LINK_GBPS if g != 400.0]
    caps = [int(c) for c in a.estimate_capacities.split(",") if c]
    if "estimate" in parts:
        tasks += [("estimate", (c, mode, opts), 1) for c in caps for mode in ("pd", "colocated")]
    done = run_tasks(tasks, a.jobs, "searches") if tasks else []
    chains = {(args[0], args[1], args[3] if len(args) > 3 else ""): res for kind, args, res in done if kind == "search"}

    # phase 2: at 2P:2D's goodput load, the link speeds' TTFT split and the prefill pool's routing
    def goodput_rate(w: str, c: str) -> float | None:
        best = chains.get((w, c, ""), {}).get("best")
        return best["rate"] if best else None

    tasks = []
    link_rate = goodput_rate(LINK_WORKLOAD, LINK_CONFIG)
    if "link" in parts and link_rate:
        tasks += [("point", (LINK_WORKLOAD, LINK_CONFIG, link_rate, opts, f"--pd-link-gbps {g:g}"), 1)
                  for g in LINK_GBPS]
    if "routing" in parts:
        for w in workloads:
            for c in ROUTING_CONFIGS:
                rate = goodput_rate(w, c) or WORKLOADS[w]["start"] * a.start_scale
                tasks += [("point", (w, c, rate, opts, f"--prefill-routing {r}"), 1)
                          for r in ("cache_aware", "round_robin")]
    fixed = run_tasks(tasks, a.jobs, "fixed-load points") if tasks else []

    doc: dict = {"model": "qwen3-coder-30b-a3b (kvemu's default)", "gpu": "h200 (kvemu's default), one per instance",
                 "gpus": GPUS, "cluster_flags": CLUSTER, "configs": CONFIGS, "duration_s": a.duration, "seed": a.seed,
                 "objectives": {w: {"ttft_p99_s": WORKLOADS[w]["ttft_p99_s"], "tpot_p99_s": WORKLOADS[w]["tpot_p99_s"],
                                    "rate": WORKLOADS[w]["rate"], "unit": WORKLOADS[w]["unit"]} for w in workloads},
                 "commands": {w: {c: "kvemu sim " + " ".join(command_line(w, c, 0.0, opts)).replace(
                     "session_rate=0", "session_rate=RATE") for c in configs} for w in workloads},
                 "argv": sys.argv[1:] if argv is None else argv}
    if "goodput" in parts:
        doc["goodput"] = {w: {c: summary(chains[(w, c, "")]) for c in configs if (w, c, "") in chains}
                          for w in workloads}
    if "link" in parts and LINK_WORKLOAD in workloads:
        at = {args[4]: res for kind, args, res in fixed if kind == "point" and args[4].startswith("--pd-link-gbps")}
        doc["link"] = {"workload": LINK_WORKLOAD, "config": LINK_CONFIG, "rate": link_rate, "gbps": {}}
        for g in LINK_GBPS:
            flag = f"--pd-link-gbps {g:g}"
            chain = chains.get((LINK_WORKLOAD, LINK_CONFIG, "" if g == 400.0 else flag))
            doc["link"]["gbps"][f"{g:g}"] = {"goodput": summary(chain) if chain else None, "at_rate": at.get(flag)}
    if "routing" in parts:
        doc["routing"] = {}
        for kind, args, res in fixed:
            if kind == "point" and args[4].startswith("--prefill-routing"):
                w, c, rate = args[0], args[1], args[2]
                doc["routing"].setdefault(w, {}).setdefault(c, {"rate": rate})[args[4].split()[1]] = res
    if "estimate" in parts:
        est = sorted((res for kind, _, res in done if kind == "estimate"),
                     key=lambda r: (r["mode"], r["capacity_blocks"]))
        m = ScmModel()
        doc["estimate"] = {"workload": "scm", "params": {"arrival_rate": m.arrival_rate, "think_mean": m.think_mean,
                                                         "continue_prob": m.continue_prob,
                                                         "prompt_blocks": m.prompt_blocks,
                                                         "response_blocks": m.response_blocks},
                           "policy": "session_lru", "points": est,
                           "max_abs_difference": {mode: max((abs(r["difference"]) for r in est if r["mode"] == mode),
                                                            default=None) for mode in ("pd", "colocated")}}
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    publish(a, doc, plot_study)
    return 0


if __name__ == "__main__":
    sys.exit(main())
