"""A KV store shared by the cluster, and what it does to routing: the study in docs/shared-store.md.

Every point is one `kvemu sim` command line (parsed and checked by `sim`'s own parser, as
bench/bench_pd.py does), on kvemu's default model and GPU (qwen3-coder-30b-a3b on one H200 per replica,
KV sized by --gpu-memory-utilization 0.9: 68.5 GiB each), 16 replicas, LRU in HBM, no host or SSD tier,
and below them one store for the whole cluster (replica/core/tiers/shared.py): Mooncake's eviction (90%
high watermark, 5% evicted, 10 s read leases), write-through (every full block a replica computes, as
LMCache and vLLM's MooncakeStoreConnector store), objects of one block (the Mooncake traces' 512 tokens
as they are; 16 tokens on the agent preset), 640 Gb/s aggregate and 0.1 ms to first byte.

  grid       per workload (the shipped Mooncake conversation trace; that trace 20 times over, as
             bench/bench_sim_e2e.py builds it; the agent preset) and per routing (`cache_aware`, `session`,
             `round_robin`): the store from 0 to the trace's working set W (the distinct blocks a cache could
             ever hold: every prompt block and every response block kept), and W / 0.9 (where Mooncake's
             watermark never evicts), each replica's link to it at 400 Gb/s
  crossover  per workload, the store size at which round_robin comes within 2 points of cache_aware (hit
             ratio across all levels) and stays there: the grid's bracket, narrowed by bisection
  link       the same at 100 Gb/s per replica, at some of the grid's sizes
  write      `--shared-write evict` (a replica writes only what its HBM evicts) beside write-through

The JSON (stdout, or --out FILE) keeps every point; --plots DIR draws docs/shared-store-*.png
(sim/shared_plots.py); --from FILE prints the tables (markdown) and redraws without running anything.

    .venv/bin/python bench/bench_shared_store.py --jobs 2 --out docs/shared-store-study.json --plots docs
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_pd import build  # noqa: E402  (one `kvemu sim` command line -> trace, settings)
from bench.bench_sim_e2e import build_trace  # noqa: E402  (the Mooncake trace N times over)
from bench.study_cli import add_study_flags, known_names, publish, show_saved  # noqa: E402
from loadgen.trace import Trace, infinite_cache_hit_ratio, response_hashes  # noqa: E402
from shared.costmodel import CostModel  # noqa: E402
from shared.progress import ProgressBar  # noqa: E402
from sim.run import simulate  # noqa: E402
from sim.shared_plots import plot_study  # noqa: E402

GIB = 1 << 30
MODEL, GPU = "qwen3-coder-30b-a3b", "h200"  # kvemu's defaults
# The cluster every point shares; the store's shape (its other settings: the store's defaults).
CLUSTER = "--gpu-memory-utilization 0.9 --reuse off --quiet --jobs 1"
STORE = "--shared-write through"
ROUTINGS = ("cache_aware", "session", "round_robin")
OVER = "W/0.9"  # the size at which the store never reaches its 90% watermark
WITHIN = 0.02  # "within 2 points" of hit ratio
# Per workload: where its requests come from and what the study runs of it. ``fractions``: the store sizes
# of the grid, as fractions of the working set W (OVER: W / 0.9); ``link`` / ``write``: the sizes repeated
# at 100 Gb/s and with --shared-write evict; ``refine``: bisection steps of the crossover; ``cost``: the
# seconds one point takes on one core, about (for the order and the ETA).
WORKLOADS: dict[str, dict[str, Any]] = {
    "mooncake": {"source": "--trace mooncake-conversation", "title": "Mooncake conversation trace",
                 "fractions": (0, 1 / 64, 1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1, OVER),
                 "link": (1 / 16, 1 / 4, 1, OVER), "write": (1 / 16, 1 / 4, 1, OVER), "refine": 3, "cost": 2.0},
    "mooncake-x20": {"source": "--trace {x20}", "title": "Mooncake conversation trace x20",
                     "fractions": (0, 1 / 4, 1, OVER), "link": (OVER,), "write": (), "refine": 0,
                     "cost": 45.0},
    "agent": {"source": "--workload agent --duration {agent_duration:g} --set session_rate={agent_rate:g}"
                        " --set tool_fanout_prob=0 --set subagent_prob=0",  # measured before the preset fanned out
              "title": "agent preset", "fractions": (0, 1 / 4, 1 / 2, 1, OVER), "link": (1 / 4, OVER),
              "write": (1 / 4,), "refine": 1, "cost": 22.0},
}
ROUTING_COST = {"cache_aware": 1.4, "session": 0.6, "round_robin": 1.0}
LINK_GBPS = (400.0, 100.0)
KEYS = ("requests", "served", "refused", "hbm_block_hit_ratio", "shared_block_hit_ratio", "all_levels_block_hit_ratio",
        "token_hit_ratio", "fetched_blocks", "recomputed_blocks", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s",
        "queue_p99_s", "preemptions", "saturated", "load_imbalance", "throughput_rps", "arrival_span_s", "drain_s",
        "wall_s")
STORE_KEYS = ("blocks", "used_blocks", "writes", "refused_writes", "reads", "evictions", "bytes_moved")


# ---------------------------------------------------------------- the workloads and their working sets


def source_args(workload: str, opts: dict) -> list[str]:
    return WORKLOADS[workload]["source"].format(**opts).split()


def cut(trace: Trace, head: int) -> Trace:
    """The first ``head`` requests (0: all), for a quick look and the test."""
    if not head or head >= len(trace.requests):
        return trace
    return Trace(trace.requests[:head], trace.block_size, trace.source, trace.meta)


def working_set(workload: str, opts: dict) -> dict:
    """The trace's working set W: the distinct blocks any cache of it could hold (its prompts' blocks and
    the response blocks a replica keeps, `--response-kv keep`: what write-through stores), and the hit ratio
    of an infinite cache (no store size or routing does better)."""
    trace, settings = build([*source_args(workload, opts), *CLUSTER.split(), "--replicas", str(opts["replicas"])])
    trace = cut(trace, opts["head"])
    responses = response_hashes(trace)
    prompt: set[int] = set()
    for r in trace.requests:
        prompt.update(r.hash_ids)
    kept = set(prompt)
    for hs in responses:
        kept.update(hs)
    cost = CostModel.from_names(MODEL, GPU)
    bb = cost.block_bytes(trace.block_size)
    return {"requests": len(trace.requests), "block_size": trace.block_size,
            "block_accesses": sum(len(r.hash_ids) for r in trace.requests),
            "prompt_tokens": sum(r.input_tokens for r in trace.requests),
            "prompt_blocks": len(prompt), "working_set_blocks": len(kept), "block_bytes": bb,
            "working_set_gib": round(len(kept) * bb / GIB, 1),
            "infinite_cache_block_hit_ratio": round(infinite_cache_hit_ratio(trace.requests, responses) or 0.0, 5),
            "hbm_blocks_per_replica": settings.capacity_blocks,
            "hbm_blocks_cluster": settings.capacity_blocks * opts["replicas"]}


def store_blocks(fraction, w: int) -> int:
    if fraction == OVER:
        return math.ceil(w / 0.9) + 1
    return math.ceil(fraction * w) if fraction else 0


def store_gib(blocks: int, block_bytes: int) -> str:
    """The --shared-cache-gib that gives ``blocks`` blocks exactly (the flag rounds down to whole blocks)."""
    return repr((blocks + 0.5) * block_bytes / GIB) if blocks else "0"


def fraction_label(fraction) -> str:
    if fraction == OVER or fraction in (0, 1):
        return str(fraction if fraction != 1 else "W") if fraction else "0"
    return f"W/{round(1 / fraction):d}"


# ---------------------------------------------------------------- one point


def command_line(workload: str, routing: str, blocks: int, ws: dict, opts: dict, gbps: float = 400.0,
                 write: str = "through") -> list[str]:
    argv = [*source_args(workload, opts), "--replicas", str(opts["replicas"]), "--routing", routing,
            *CLUSTER.split()]
    if blocks:
        argv += ["--shared-cache-gib", store_gib(blocks, ws["block_bytes"]), "--shared-write", write]
        if gbps != 400.0:
            argv += ["--shared-nic-gbps", f"{gbps:g}"]
    return argv


def run_point(workload: str, routing: str, blocks: int, ws: dict, opts: dict, gbps: float = 400.0,
              write: str = "through") -> dict:
    trace, settings = build(command_line(workload, routing, blocks, ws, opts, gbps, write))
    run = simulate(cut(trace, opts["head"]), settings)
    out: dict[str, Any] = {k: run.get(k) for k in KEYS}
    out["shared_block_hit_ratio"] = out["shared_block_hit_ratio"] or 0.0
    reps = run["per_replica"]
    queried = sum(p["tokens_queried"] for p in reps)
    computed = sum(p["scheduler"]["prefill_tokens"] for p in reps)
    again = sum(p["scheduler"]["readmission_prefill_tokens"] for p in reps)
    # tokens: what the replicas computed of their prompts (prefill, readmissions after preemption apart)
    out["all_levels_token_hit_ratio"] = round(1 - (computed - again) / queried, 5) if queried else None
    out["recomputed_tokens"] = computed
    out["readmission_tokens"] = again
    out.update(workload=workload, routing=routing, store_blocks=blocks, nic_gbps=gbps, write=write)
    stores = (run.get("tiers") or {}).get("shared") or []
    if stores:
        store = {k: sum(s[k] for s in stores) for k in STORE_KEYS}
        span = (run["arrival_span_s"] or 0.0) + (run["drain_s"] or 0.0)
        # mean use over the run: the store's aggregate link, and each replica's NIC on average
        store["store_link_busy"] = round(store["bytes_moved"] / (stores[0]["store_gbps"] * 1e9 / 8 * span), 5)
        nic = run["tiers"]["bytes_moved"].get("shared", 0)
        store["nic_busy_mean"] = round(nic / (gbps * 1e9 / 8 * span * opts["replicas"]), 5)
        out["store"] = store
        assert store["blocks"] == blocks, (store["blocks"], blocks)  # the flag gave the size asked
    return out


# ---------------------------------------------------------------- running many at once


def _task(args: tuple) -> tuple[tuple, dict]:
    return args, run_point(*args)


def point_cost(workload: str, routing: str, blocks: int) -> float:
    return WORKLOADS[workload]["cost"] * ROUTING_COST[routing] * (0.3 if not blocks else 1.0)


def run_tasks(tasks: list[tuple], jobs: int, label: str) -> list[tuple[tuple, dict]]:
    """Points ``(workload, routing, blocks, ws, opts, gbps, write)`` on ``jobs`` processes, the longest
    first; progress weighted by each point's expected seconds, with an ETA."""
    weights = {id(t): max(1, round(point_cost(t[0], t[1], t[2]))) for t in tasks}
    bar = ProgressBar(label, sum(weights.values()), "s")
    out = []
    with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(tasks)))) as executor:
        futures = {executor.submit(_task, t): weights[id(t)] for t in sorted(tasks, key=lambda t: -weights[id(t)])}
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            for fut in done:
                out.append(fut.result())
                bar.update(futures[fut])
                bar.set_postfix(f"{len(out)}/{len(tasks)} points")
    bar.close()
    return out


# ---------------------------------------------------------------- the crossover


def gap_curve(points: list[dict], other: str = "round_robin") -> list[tuple[int, float]]:
    """(store blocks, cache_aware's hit ratio across all levels minus ``other``'s), by size."""
    by = {(p["routing"], p["store_blocks"]): p["all_levels_block_hit_ratio"] for p in points}
    sizes = sorted({b for r, b in by if r == "cache_aware" and (other, b) in by})
    return [(b, by[("cache_aware", b)] - by[(other, b)]) for b in sizes]


def bracket(curve: list[tuple[int, float]]) -> tuple[int | None, int | None]:
    """(largest size not within WITHIN, the smallest size from which every larger one is within)."""
    within = None
    for b, g in reversed(curve):
        if g > WITHIN:
            return b, within
        within = b
    return None, within


# ---------------------------------------------------------------- the document


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:,.0f}" if x >= 0.01 else f"{x * 1000:.1f}"


def _gib(blocks: int | None, bb: int) -> str:
    return "-" if blocks is None else f"{blocks * bb / GIB:,.0f}"


def tables(doc: dict) -> str:
    """The document's results as markdown tables (what docs/shared-store.md shows)."""
    out: list[str] = []
    ws = doc["working_sets"]
    out += ["| workload | requests | prompt tokens | block | W (blocks) | W (GiB) | HBM, 16 replicas (blocks) | "
            "infinite cache hit |", "|---|---|---|---|---|---|---|---|"]
    for w, s in ws.items():
        out.append(f"| {w} | {s['requests']:,} | {s['prompt_tokens']:,} | {s['block_size']} | "
                   f"{s['working_set_blocks']:,} | {s['working_set_gib']:,.0f} | {s['hbm_blocks_cluster']:,} | "
                   f"{s['infinite_cache_block_hit_ratio']:.4f} |")
    if doc.get("crossover"):
        out += ["", "| workload | round_robin within 2 points of cache_aware from | (GiB) | of W | last size not "
                "within | session within 2 points from | gap at store 0: round_robin / session |",
                "|---|---|---|---|---|---|---|"]
        for w, c in doc["crossover"].items():
            bb = ws[w]["block_bytes"]
            at = c["within_from_blocks"]
            frac = f"{at / ws[w]['working_set_blocks']:.3f}" if at is not None else "-"
            s_at = c["session_within_from_blocks"]
            out.append(f"| {w} | {at if at is not None else 'never'}{'' if at is None else ' blocks'} | "
                       f"{_gib(at, bb)} | {frac} | {c['not_within_blocks'] if c['not_within_blocks'] is not None else '-'}"
                       f" | {s_at if s_at is not None else 'never'}{'' if s_at is None else ' blocks'} | "
                       f"{c['gap_at_0']:+.3f} / {c['session_gap_at_0']:+.3f} |")
    if doc.get("grid"):
        for w, pts in doc["grid"].items():
            bb = ws[w]["block_bytes"]
            out += ["", f"{WORKLOADS.get(w, {}).get('title', w)} ({w}), each replica's link at 400 Gb/s:", "",
                    "| store | GiB | routing | hit, all levels (blocks) | (tokens) | HBM | store | recomputed tokens | "
                    "TTFT p50 / p99 ms | evictions | store link busy |", "|---|---|---|---|---|---|---|---|---|---|---|"]
            for p in sorted(pts, key=lambda p: (p["store_blocks"], ROUTINGS.index(p["routing"]))):
                st = p.get("store") or {}
                out.append(f"| {p['fraction']} | {_gib(p['store_blocks'], bb)} | {p['routing']} | "
                           f"{p['all_levels_block_hit_ratio']:.4f} | {p['all_levels_token_hit_ratio']:.4f} | "
                           f"{p['hbm_block_hit_ratio']:.4f} | {p['shared_block_hit_ratio']:.4f} | "
                           f"{p['recomputed_tokens'] / 1e6:,.1f} M | {_ms(p['ttft_p50_s'])} / {_ms(p['ttft_p99_s'])}"
                           f"{' (saturated)' if p['saturated'] else ''} | "
                           + (f"{st['evictions']:,} | {st['store_link_busy']:.1%} |" if st else "- | - |"))
    if doc.get("link"):
        out += ["", "| workload | store | routing | Gb/s per replica | hit, all levels | store | TTFT p50 / p99 ms | "
                "NIC busy (mean) | store link busy |", "|---|---|---|---|---|---|---|---|---|"]
        for w, pts in doc["link"].items():
            for p in sorted(pts, key=lambda p: (p["store_blocks"], ROUTINGS.index(p["routing"]), -p["nic_gbps"])):
                st = p["store"]
                out.append(f"| {w} | {p['fraction']} | {p['routing']} | {p['nic_gbps']:g} | "
                           f"{p['all_levels_block_hit_ratio']:.4f} | {p['shared_block_hit_ratio']:.4f} | "
                           f"{_ms(p['ttft_p50_s'])} / {_ms(p['ttft_p99_s'])} | {st['nic_busy_mean']:.1%} | "
                           f"{st['store_link_busy']:.1%} |")
    if doc.get("write"):
        out += ["", "| workload | store | routing | write | hit, all levels | HBM | store | TTFT p50 / p99 ms | "
                "blocks written |", "|---|---|---|---|---|---|---|---|---|"]
        for w, pts in doc["write"].items():
            for p in sorted(pts, key=lambda p: (p["store_blocks"], ROUTINGS.index(p["routing"]), p["write"])):
                out.append(f"| {w} | {p['fraction']} | {p['routing']} | {p['write']} | "
                           f"{p['all_levels_block_hit_ratio']:.4f} | {p['hbm_block_hit_ratio']:.4f} | "
                           f"{p['shared_block_hit_ratio']:.4f} | {_ms(p['ttft_p50_s'])} / {_ms(p['ttft_p99_s'])} | "
                           f"{p['store']['writes']:,} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    p.add_argument("--parts", default="grid,link,write", help="which parts besides the grid: grid, link, write")
    p.add_argument("--routings", default=",".join(ROUTINGS))
    p.add_argument("--fractions", default=None, help="the grid's store sizes for every workload, comma-separated"
                   " fractions of W or W/0.9 (default: each workload's)")
    p.add_argument("--refine", type=int, default=None, help="bisection steps of the crossover (default: each"
                   " workload's)")
    p.add_argument("--replicas", type=int, default=16)
    p.add_argument("--agent-duration", type=float, default=200.0, help="seconds of agent session starts")
    p.add_argument("--agent-rate", type=float, default=1.0, help="agent sessions/s")
    p.add_argument("--head", type=int, default=0, help="only the first N requests of each trace (a quick look)")
    p.add_argument("--work", default="scratch/shared-store", help="where the 20x trace is written (once)")
    add_study_flags(p, "shared-store-*.png")
    a = p.parse_args(argv)
    if show_saved(a, tables, plot_study):
        return 0
    workloads = known_names(p, "--workloads", a.workloads, WORKLOADS)
    routings = known_names(p, "--routings", a.routings, ROUTINGS)
    parts = set(known_names(p, "--parts", a.parts, ("grid", "link", "write"))) | {"grid"}
    if "cache_aware" not in routings or "round_robin" not in routings:
        p.error("--routings: the crossover needs cache_aware and round_robin")
    fractions = None if a.fractions is None else tuple(
        OVER if f == OVER else float(f) for f in a.fractions.split(","))
    t0 = time.perf_counter()
    work = Path(a.work)
    x20 = work / "mooncake_conversation_x20.jsonl"
    if "mooncake-x20" in workloads and not x20.exists():
        work.mkdir(parents=True, exist_ok=True)
        print(f"writing {x20} (the Mooncake conversation trace 20 times, bench_sim_e2e.build_trace)", file=sys.stderr)
        build_trace(x20, 20)
    opts = {"replicas": a.replicas, "agent_duration": a.agent_duration, "agent_rate": a.agent_rate,
            "x20": str(x20), "head": a.head}

    ws = {w: working_set(w, opts) for w in workloads}
    sizes = {w: [(f, store_blocks(f, ws[w]["working_set_blocks"])) for f in (fractions or WORKLOADS[w]["fractions"])]
             for w in workloads}

    def label(w: str, blocks: int) -> str:
        return next((fraction_label(f) for f, b in sizes[w] if b == blocks),
                    f"{blocks / ws[w]['working_set_blocks']:.4f} W")

    # phase 1: the grid, the link and the write points
    tasks: list[tuple] = []
    for w in workloads:
        spec = WORKLOADS[w]
        for f, b in sizes[w]:
            tasks += [(w, r, b, ws[w], opts, 400.0, "through") for r in routings]
            if "link" in parts and b and (fractions is not None or f in spec["link"]):
                tasks += [(w, r, b, ws[w], opts, 100.0, "through") for r in routings]
            if "write" in parts and b and (fractions is not None or f in spec["write"]):
                tasks += [(w, r, b, ws[w], opts, 400.0, "evict") for r in routings]
    results = run_tasks(tasks, a.jobs, "grid")
    points = [res for _, res in results]

    # phase 2: the crossover, by bisection inside the grid's bracket (every workload's step at once)
    state = {}
    for w in workloads:
        grid = [q for q in points if q["workload"] == w and q["nic_gbps"] == 400.0 and q["write"] == "through"]
        lo, hi = bracket(gap_curve(grid))
        state[w] = {"lo": lo, "hi": hi, "steps": WORKLOADS[w]["refine"] if a.refine is None else a.refine,
                    "points": []}
    while True:
        step = []
        for w, s in state.items():
            if s["steps"] > 0 and s["lo"] is not None and s["hi"] is not None and s["hi"] - s["lo"] > 1:
                lo = max(s["lo"], s["hi"] // 4, 1)  # from store 0: the first step halves the smallest size within
                mid = round(math.sqrt(lo * s["hi"]))  # sizes are spread geometrically
                if mid <= s["lo"] or mid >= s["hi"]:
                    mid = (s["lo"] + s["hi"]) // 2
                step += [(w, r, mid, ws[w], opts, 400.0, "through") for r in ("cache_aware", "round_robin")]
                s["steps"] -= 1
        if not step:
            break
        done = [res for _, res in run_tasks(step, a.jobs, "crossover")]
        for w in {q["workload"] for q in done}:
            mine = [q for q in done if q["workload"] == w]
            state[w]["points"] += mine
            gap = gap_curve(mine)[0]
            state[w]["lo" if gap[1] > WITHIN else "hi"] = gap[0]

    for q in points + [q for s in state.values() for q in s["points"]]:
        q["fraction"] = label(q["workload"], q["store_blocks"])
    doc: dict = {"model": f"{MODEL} (kvemu's default)", "gpu": f"{GPU} (kvemu's default), one per replica",
                 "replicas": a.replicas, "cluster_flags": CLUSTER, "store_flags": STORE, "within": WITHIN,
                 "routings": routings, "agent": {"duration_s": a.agent_duration, "session_rate": a.agent_rate},
                 "head": a.head, "working_sets": ws,
                 "commands": {w: "kvemu sim " + " ".join(command_line(w, "ROUTING", 1, ws[w], opts)).replace(
                     store_gib(1, ws[w]["block_bytes"]), "G") for w in workloads},
                 "argv": sys.argv[1:] if argv is None else argv}
    doc["grid"] = {w: [q for q in points if q["workload"] == w and q["nic_gbps"] == 400.0 and q["write"] == "through"]
                   for w in workloads}
    doc["crossover"] = {}
    for w in workloads:
        curve = gap_curve(doc["grid"][w] + state[w]["points"])
        scurve = gap_curve(doc["grid"][w], "session") if "session" in routings else []
        lo, hi = bracket(curve)
        doc["crossover"][w] = {"within_from_blocks": hi, "not_within_blocks": lo,
                               "within_from_gib": None if hi is None else round(hi * ws[w]["block_bytes"] / GIB, 1),
                               "within_from_fraction_of_w": None if hi is None else round(
                                   hi / ws[w]["working_set_blocks"], 4),
                               "session_within_from_blocks": bracket(scurve)[1] if scurve else None,
                               "gap_at_0": round(curve[0][1], 5) if curve and curve[0][0] == 0 else None,
                               "session_gap_at_0": round(scurve[0][1], 5) if scurve and scurve[0][0] == 0 else None,
                               "gaps": [[b, round(g, 5)] for b, g in curve],
                               "session_gaps": [[b, round(g, 5)] for b, g in scurve],
                               "points": state[w]["points"]}
    if "link" in parts:
        doc["link"] = {}
        for w in workloads:
            slow = [q for q in points if q["workload"] == w and q["nic_gbps"] == 100.0]
            at = {q["store_blocks"] for q in slow}
            doc["link"][w] = slow + [q for q in doc["grid"][w] if q["store_blocks"] in at]
    if "write" in parts:
        doc["write"] = {}
        for w in workloads:
            ev = [q for q in points if q["workload"] == w and q["write"] == "evict"]
            at = {q["store_blocks"] for q in ev}
            doc["write"][w] = ev + [q for q in doc["grid"][w] if q["store_blocks"] in at]
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    publish(a, doc, plot_study)
    return 0


if __name__ == "__main__":
    sys.exit(main())
