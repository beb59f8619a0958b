"""The FlashGen experiment (Jeong and Ahn, ASPLOS 2025) in virtual time: four serving configurations on the `chat`
preset (ShareGPT-like: median 3, mean 7 turns, human gaps) at rising arrival rates.

  (a) vllm          HBM prefix cache, response KV kept (colocated), FCFS
  (b) cachedattn    host DRAM and SSD tiers (exclusive), no GPU caching: each turn's KV moves
                    down when it ends and is always fetched back (CachedAttention), FCFS
  (c) flashgen_cache  + inclusive copies (HBM eviction is free), fetch-or-recompute with SSD
                    pre-staging, response KV kept in HBM too, FCFS
  (d) flashgen      (c) + the reordering scheduler

For each configuration and rate: TTFT p50/p95, throughput, time-averaged HBM utilisation,
fetched / recomputed blocks, preemptions. Then per configuration the highest rate whose P95
TTFT meets the objective (and whose queue did not grow without bound), and the ratios FlashGen
reports: (d)/(a) and (c)/(b) sustainable rate. Prints one JSON document; ``--plot`` draws
P95 TTFT against rate per configuration.

    .venv/bin/python bench/bench_flashgen.py --model opt-13b --gpu a100-80gb --tp 1
    .venv/bin/python bench/bench_flashgen.py --model llama-2-70b --gpu a100-80gb --tp 2 --plot docs/flashgen.png
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace

from kvemu.options.tiers import tiers_on
from loadgen.workloads import generate
from replica.core.sched.sched_types import DEFAULT_TOKEN_BUDGET
from shared.costmodel import CostModel
from shared.progress import ProgressBar
from sim.simulator import SimSettings, simulate

CONFIGS = ("vllm", "cachedattn", "flashgen_cache", "flashgen")
GIB = 1024**3


def hbm_kv_gib(cost: CostModel, utilization: float, max_running: int) -> float:
    """KV space per replica, vLLM's capacity rule as `--gpu-memory-utilization` applies it
    (``CostModel.kv_budget``: each GPU's memory at ``utilization`` less its weights and the
    activations of the largest step, over the replica's GPUs)."""
    b = cost.kv_budget(utilization, DEFAULT_TOKEN_BUDGET, max_running, 16)
    return b.tp * b.kv_bytes / GIB


def settings_for(config: str, base: SimSettings, cost: CostModel, block_size: int, host_gib: float,
                 ssd_gib: float) -> SimSettings:
    tiers = tiers_on(cost, block_size, host_gib, ssd_gib)
    if config == "vllm":
        return replace(base, response_kv="keep", scheduler="fcfs")
    if config == "cachedattn":  # KV saved below after every turn and loaded back: no GPU caching
        return replace(base, response_kv="keep", scheduler="fcfs",
                       tiers=replace(tiers, mode="exclusive", fetch="always", hbm_caching=False))
    cache = replace(base, response_kv="keep", tiers=replace(tiers, mode="inclusive", fetch="auto"))
    return replace(cache, scheduler="fcfs" if config == "flashgen_cache" else "reorder")


def run_point(args: tuple) -> dict:
    config, rate, opts = args
    trace = generate("chat", opts["duration"], seed=opts["seed"],
                     overrides={"session_rate": str(rate), "max_context": str(opts["max_context"])})
    cost = CostModel.from_names(opts["model"], opts["gpu"])
    cap = cost.gib_to_blocks(opts["hbm_gib"], trace.block_size)
    base = SimSettings(capacity_blocks=cap, model=opts["model"], gpu=opts["gpu"], max_running=opts["max_running"],
                       reuse="off")
    s = settings_for(config, base, cost, trace.block_size, opts["host_gib"], opts["ssd_gib"])
    t0 = time.perf_counter()
    run = simulate(trace, s)
    keys = ("requests", "refused", "block_hit_ratio", "hbm_block_hit_ratio", "host_block_hit_ratio", "ssd_block_hit_ratio",
            "fetched_blocks", "recomputed_blocks", "preemptions", "hbm_utilization", "throughput_rps",
            "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "saturated")
    span = run["arrival_span_s"] or 1.0
    # served, not requests: a preempted request is acquired (and counted by the pool) again
    return {"config": config, "session_rate": rate, "offered_rps": round(run["served"] / span, 4),
            "arrivals_in_window_rps": round(sum(r.t < opts["duration"] for r in trace.requests) / opts["duration"], 4),
            "wall_s": round(time.perf_counter() - t0, 2), **{k: run.get(k) for k in keys}}


def sustained(rows: list[dict], slo: float) -> dict[str, float]:
    """Per configuration: the highest request rate (requests/s arriving while sessions start)
    meeting the P95 TTFT objective without a queue that grows without bound, every lower rate
    meeting it too."""
    out = {}
    for config in CONFIGS:
        best = 0.0
        for r in sorted((r for r in rows if r["config"] == config), key=lambda r: r["session_rate"]):
            if r["saturated"] or r["ttft_p95_s"] is None or r["ttft_p95_s"] > slo:
                break
            best = r["arrivals_in_window_rps"]
        out[config] = round(best, 3)
    return out


def plot(rows: list[dict], path: str, title: str, slo: float) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    for config in CONFIGS:
        pts = sorted((r for r in rows if r["config"] == config), key=lambda r: r["session_rate"])
        xs = [r["arrivals_in_window_rps"] for r in pts]
        ax1.plot(xs, [r["ttft_p95_s"] for r in pts], marker="o", label=config)
        ax2.plot(xs, [100 * (r["hbm_utilization"] or 0) for r in pts], marker="o", label=config)
    ax1.axhline(slo, color="0.5", ls="--", lw=1, label=f"objective: P95 TTFT {slo:g} s")
    ax1.set_yscale("log")
    ax1.set_xlabel("offered load (requests/s)")
    ax1.set_ylabel("P95 TTFT (s, emulated)")
    ax1.set_title("P95 time to first token")
    ax2.set_xlabel("offered load (requests/s)")
    ax2.set_ylabel("HBM utilisation (% of KV blocks in use, time-averaged)")
    ax2.set_title("HBM utilisation")
    ax2.set_ylim(0, 105)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)



def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="opt-13b")
    p.add_argument("--gpu", default="a100-80gb")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--rates", default="0.2,0.4,0.6,0.8,1.0", help="new chat sessions per second")
    p.add_argument("--duration", type=float, default=1200.0, help="seconds of session starts per point")
    p.add_argument("--host-gib", type=float, default=224.0, help="host DRAM for KV per replica (FlashGen's: 224 GB)")
    p.add_argument("--ssd-gib", type=float, default=2000.0, help="SSD for KV per replica (two NVMe drives)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--max-running", type=int, default=256)
    p.add_argument("--max-context", type=int, default=None,
                   help="a session ends at the turn that would exceed it (default: the model's window, "
                        "its max_position_embeddings: OPT 2,048, Llama 2 4,096)")
    p.add_argument("--slo", type=float, default=5.0, help="P95 TTFT objective, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--plot", default=None)
    a = p.parse_args(argv)
    gpu = a.gpu if a.tp == 1 else f"{a.gpu}@tp{a.tp}"
    cost = CostModel.from_names(a.model, gpu)
    hbm_gib = hbm_kv_gib(cost, a.gpu_memory_utilization, a.max_running)
    if hbm_gib <= 0:
        print(f"error: {a.model} does not fit on {a.tp} x {a.gpu}", file=sys.stderr)
        return 2
    window = a.max_context or cost.model.max_context  # its max_position_embeddings (shared/costmodel.py)
    opts = {"max_context": window, "duration": a.duration, "seed": a.seed, "model": a.model, "gpu": gpu,
            "hbm_gib": hbm_gib, "host_gib": a.host_gib, "ssd_gib": a.ssd_gib, "max_running": a.max_running}
    rates = [float(x) for x in a.rates.split(",")]
    jobs = [(c, r, opts) for c in CONFIGS for r in rates]
    rows = []
    bar = ProgressBar("flashgen", len(jobs), "point")
    with ProcessPoolExecutor(max_workers=max(1, min(a.jobs, len(jobs)))) as pool:
        for fut in as_completed([pool.submit(run_point, j) for j in jobs]):
            rows.append(fut.result())
            bar.update()
    bar.close()
    rows.sort(key=lambda r: (CONFIGS.index(r["config"]), r["session_rate"]))
    best = sustained(rows, a.slo)
    high = max(rates)
    p95_high = {r["config"]: r["ttft_p95_s"] for r in rows if r["session_rate"] == high}
    util = {c: round(max((r["hbm_utilization"] or 0) for r in rows if r["config"] == c), 3) for c in CONFIGS}

    def ratio(x: str, y: str) -> float | None:
        return round(best[x] / best[y], 2) if best[y] else None

    doc = {"model": a.model, "gpu": a.gpu, "tp": a.tp, "max_context": window, "hbm_kv_gib": round(hbm_gib, 1), "host_gib": a.host_gib,
           "ssd_gib": a.ssd_gib, "slo_p95_ttft_s": a.slo, "duration_s": a.duration,
           "sustained_rps": best, "flashgen_over_vllm": ratio("flashgen", "vllm"),
           "flashgen_cache_over_cachedattn": ratio("flashgen_cache", "cachedattn"),
           "p95_ttft_at_highest_rate_s": p95_high, "peak_hbm_utilization": util, "rows": rows}
    print(json.dumps(doc, indent=1))
    if a.plot:
        plot(rows, a.plot, f"FlashGen configurations, chat preset: {a.model} on {a.tp} x {a.gpu}, "
                           f"{hbm_gib:.0f} GiB HBM KV, {a.host_gib:g} GiB host, {a.ssd_gib:g} GiB SSD", a.slo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
