"""The FlashGen experiment (Jeong and Ahn, ASPLOS 2025) as its paper runs it, in virtual time.

Six serving configurations, each a set of `kvemu sim` / `kvemu up` flags (``CONFIGS``; printed in
the JSON under "flags"), on the paper's instance (2 x A100 80GB PCIe, no NVLink; 224 GB of host
DRAM for KV; two NVMe drives) and the `chat` preset (ShareGPT-like), per model:

  vllm_recompute  the paper's baseline, vLLM v0: no KV kept across requests (prefix caching off: every
                  turn prepends and recomputes its history), FCFS, recompute preemption, watermark 0.01,
                  steps of max(window, 2,048) tokens (the five systems of the paper all run on vLLM v0)
  vllm            today's vLLM (v1): prefix caching, each response's KV kept, FCFS, no watermark, 8,192
  sched_only      FlashGen's reordering scheduler on the paper's baseline ("FlashGen-Sched only")
  cachedattn      CachedAttention: every turn's KV saved to host / SSD when it ends and loaded back,
                  nothing kept in HBM between requests, FCFS
  flashgen_cache  FlashGen-Cache: HBM, host and SSD as one inclusive cache (each block copied down as
                  it is produced, decode blocks as they fill), fetch or recompute, FCFS
  flashgen        FlashGen-Cache and FlashGen-Sched

The paper's metric: throughput at equal latency. Per configuration and seed, the highest arrival
rate whose P95 TTFT meets the objective (and whose queue does not grow without bound), found by
doubling then bisection on the session rate; over the seeds its mean and spread. At that rate:
HBM use while requests wait, the mean batch size, per-tier hits. At one common rate (the one
FlashGen sustains) every configuration's P95 TTFT, as the paper compares them. ``--ablations``
adds FlashGen with one mechanism switched off at a time, and the two vLLMs on NVLink A100s.
``--json FILE`` writes the document; ``--plot FILE.png`` draws it.

    .venv/bin/python bench/bench_flashgen.py --model opt-13b --tp 1 --jobs 2 --json opt13b.json --plot opt13b.png
    .venv/bin/python bench/bench_flashgen.py --model llama-2-70b --tp 2 --jobs 2 --json l70b.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed

from kvemu import sim_cmd
from loadgen.stats import conversation_shape
from shared.costmodel import CostModel
from shared.progress import ProgressBar
from sim.run import simulate

GB = 1e9
GIB = 1024**3
# vLLM v0, on which the paper's systems are built: its block manager's watermark (admit only while 1% of
# the blocks stays free) and its step size, max_num_batched_tokens = max(max_model_len, 2048) by default
# (2,048 tokens for OPT, 4,096 for Llama 2; today's vLLM: 8,192, kvemu's default).
VLLM_V0 = "--watermark 0.01 --token-budget {budget}"
# vLLM v0's steps (prefills or decodes, whole prompts, prefills first): the paper's baseline and Sched only
# on it. The cached systems keep kvemu's mixed steps (their step budget counts a prompt before its cache
# hits under v0, which a cached prompt would not use; replica/core/sched/v0_steps.py).
V0_STEPS = "--step-rule v0"
# Two 960 GB NVMe drives, striped. The paper names no model; a PCIe 4.0 datacenter drive of that size
# reads about 6.5 GB/s and writes about 1.5 GB/s sequentially (Samsung PM9A3 960 GB's datasheet), at the
# sizes FlashGen moves (a block's KV: 0.8-13 MB, 64-320 KiB a layer), not kvemu's 7 / 5 GB/s default.
DRIVE = "--ssd-drive-read-gbps 6.5 --ssd-drive-write-gbps 1.5"
TIERS = "--host-cache-gib {host} --ssd-cache-gib {ssd} --ssd-drives {drives} " + DRIVE
CONFIGS = {
    "vllm_recompute": f"--prefix-caching off --scheduler fcfs {VLLM_V0} {V0_STEPS}",
    "vllm": "--scheduler fcfs",
    "sched_only": f"--prefix-caching off --scheduler reorder {VLLM_V0} {V0_STEPS}",
    "cachedattn": f"{TIERS} --tier-mode exclusive --fetch always --no-hbm-caching --scheduler fcfs {VLLM_V0}",
    "flashgen_cache": f"{TIERS} --tier-mode inclusive --fetch auto --scheduler fcfs {VLLM_V0}",
    "flashgen": f"{TIERS} --tier-mode inclusive --fetch auto --scheduler reorder {VLLM_V0}",
}
# One mechanism of FlashGen off at a time, and the baselines on the SXM (NVLink) A100 instead.
ABLATIONS = {
    "flashgen_exclusive": f"{TIERS} --tier-mode exclusive --fetch auto --scheduler reorder {VLLM_V0}",
    "flashgen_fetch_always": f"{TIERS} --tier-mode inclusive --fetch always --scheduler reorder {VLLM_V0}",
    "flashgen_no_ssd": "--host-cache-gib {host} --tier-mode inclusive --fetch auto --scheduler reorder " + VLLM_V0,
    "flashgen_v1_steps": f"{TIERS} --tier-mode inclusive --fetch auto --scheduler reorder",  # no watermark, 8,192
    "cachedattn_ssd_only": ("--ssd-cache-gib {ssd} --ssd-drives {drives} --tier-mode exclusive --fetch always"
                            " --no-hbm-caching --scheduler fcfs " + VLLM_V0),  # "SSD-limited", as the paper has it
    "sched_only_one_loan": f"--prefix-caching off --scheduler reorder --max-loans 1 {VLLM_V0} {V0_STEPS}",
    # this round's I/O path, one difference at a time: the baseline on kvemu's mixed steps; the all-reduce
    # priced apart from the host copies; kvemu's default drive (7 / 5 GB/s)
    "vllm_recompute_v1_steps": f"--prefix-caching off --scheduler fcfs {VLLM_V0}",
    "flashgen_separate_tp_link": f"{TIERS} --tier-mode inclusive --fetch auto --scheduler reorder {VLLM_V0}"
                                 " --separate-tp-link",
    "cachedattn_separate_tp_link": (f"{TIERS} --tier-mode exclusive --fetch always --no-hbm-caching --scheduler fcfs"
                                    f" {VLLM_V0} --separate-tp-link"),
    "flashgen_default_drive": (f"--host-cache-gib {{host}} --ssd-cache-gib {{ssd}} --ssd-drives {{drives}}"
                               f" --tier-mode inclusive --fetch auto --scheduler reorder {VLLM_V0}"),
    "vllm_recompute_nvlink": f"--prefix-caching off --scheduler fcfs {VLLM_V0} {V0_STEPS} --gpu a100-80gb",
    "flashgen_nvlink": f"{TIERS} --tier-mode inclusive --fetch auto --scheduler reorder {VLLM_V0} --gpu a100-80gb",
}
# The paper's figures (throughput at equal latency, over vLLM; OPT-30B's P95 TTFT), for the side-by-side.
PAPER = {"flashgen_over_vllm": [1.55, 2.85], "flashgen_cache_over_cachedattn": [1.13, 1.19],
         "hbm_util": {"flashgen": 0.98, "vllm": 0.88},
         "opt_30b_p95_ttft_s": {"vllm_recompute": 16.9, "cachedattn": 7.8, "sched_only": 14.2, "flashgen": 1.3},
         "sharegpt": {"turns_median": 3, "turns_mean": 7, "prompt_over_new_mean": 99}}
KEYS = ("requests", "served", "refused", "ttft_p50_s", "ttft_p95_s", "hbm_utilization", "hbm_utilization_queued",
        "hbm_utilization_head_blocked",
        "mean_batch_size", "hbm_block_hit_ratio", "host_block_hit_ratio", "ssd_block_hit_ratio", "fetched_blocks",
        "recomputed_blocks", "preemptions", "throughput_rps", "saturated", "engine")


def config_flags(flags: str, opts: dict) -> list[str]:
    """A configuration's own flags, the tier sizes filled in (GB as the paper gives them, in GiB)."""
    return flags.format(host=round(opts["host_gb"] * GB / GIB, 1), ssd=round(opts["ssd_gb"] * GB / GIB, 1),
                        drives=opts["drives"], budget=max(opts["window"], 2048)).split()


def command_line(config: str, flags: str, rate: float, seed: int, opts: dict) -> list[str]:
    """The `kvemu sim` arguments of one configuration at one session rate (its flags last: they win)."""
    return ["--workload", "chat", "--duration", str(opts["duration"]), "--seed", str(seed),
            "--set", f"session_rate={rate:.6g}", "--set", f"max_context={opts['window']}",
            "--model", opts["model"], "--gpu", opts["gpu"], "--tp", str(opts["tp"]),
            "--gpu-memory-utilization", str(opts["utilization"]), "--reuse", "off", "--quiet", "--jobs", "1",
            *config_flags(flags, opts)]


def run_point(config: str, flags: str, rate: float, seed: int, opts: dict) -> dict:
    """One `kvemu sim` run: parsed and checked by its own parser, so the flags are exactly a user's."""
    p = argparse.ArgumentParser()
    sim_cmd.configure(p)
    args = p.parse_args(command_line(config, flags, rate, seed, opts))
    with contextlib.redirect_stderr(io.StringIO()):  # the capacity line each run prints: once, in the JSON
        trace, grid = sim_cmd.runs_of(args)
    run = simulate(trace, grid[0])
    window = opts["duration"]
    out = {k: run.get(k) for k in KEYS}
    out["hbm_util_queued"] = out.pop("hbm_utilization_queued")  # HBM held by running requests while some wait
    out["hbm_util_head_blocked"] = out.pop("hbm_utilization_head_blocked")  # ... while the head waits for memory
    tiers = run.get("tiers") or {}
    out["tier_recomputed"] = tiers.get("recomputed_from_tier_blocks", 0)  # fetch auto chose recompute
    out["bytes_moved"] = tiers.get("bytes_moved", {})
    out.update(session_rate=rate, rps=round(sum(r.t < window for r in trace.requests) / window, 4))
    out["meets"] = (not run["saturated"] and run["ttft_p95_s"] is not None and run["ttft_p95_s"] <= opts["slo"])
    return out


def sustainable(config: str, flags: str, seed: int, opts: dict) -> dict:
    """Double the session rate until the objective fails, then bisect ``opts['steps']`` times: the
    highest rate met (every point tried is kept, for the plot)."""
    points, rate = [], opts["start_rate"]
    best = None
    while rate <= opts["max_rate"]:
        pt = run_point(config, flags, rate, seed, opts)
        points.append(pt)
        if not pt["meets"]:
            break
        best, rate = pt, rate * 2
    lo, hi = (best["session_rate"] if best else 0.0), rate
    for _ in range(opts["steps"] if rate <= opts["max_rate"] else 0):
        mid = (lo + hi) / 2
        pt = run_point(config, flags, mid, seed, opts)
        points.append(pt)
        if pt["meets"]:
            best, lo = pt, mid
        else:
            hi = mid
    return {"config": config, "seed": seed, "best": best, "points": points}


def at_rate(config: str, flags: str, rate: float, seed: int, opts: dict) -> dict:
    return {"config": config, "seed": seed, "common": run_point(config, flags, rate, seed, opts)}


def parallel(jobs: list[tuple], workers: int, label: str, fn) -> list[dict]:
    out = []
    bar = ProgressBar(label, len(jobs), "task")
    with ProcessPoolExecutor(max_workers=max(1, min(workers, len(jobs)))) as pool:
        for fut in as_completed([pool.submit(fn, *j) for j in jobs]):
            out.append(fut.result())
            bar.update()
    bar.close()
    return out


def mean_of(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r is not None and r.get(key) is not None]
    return round(statistics.fmean(values), 4) if values else None


def summarize(name: str, chains: list[dict], common: list[dict]) -> dict:
    """Over the seeds: the sustainable rate's mean and spread, and the means of what was measured there."""
    mine = sorted((c for c in chains if c["config"] == name), key=lambda c: c["seed"])
    best = [c["best"] for c in mine]
    rps = [b["rps"] if b else 0.0 for b in best]
    found = [b for b in best if b]
    doc = {"sustainable_rps": round(statistics.fmean(rps), 3),
           "spread": {"min": min(rps), "max": max(rps), "stdev": round(statistics.pstdev(rps), 3)},
           "per_seed_rps": rps, "sustainable_session_rate": [b["session_rate"] if b else 0.0 for b in best]}
    doc.update({k: mean_of(found, k) for k in ("ttft_p95_s", "hbm_utilization", "hbm_util_queued", "hbm_util_head_blocked",
                                                "mean_batch_size", "hbm_block_hit_ratio", "host_block_hit_ratio",
                                                "ssd_block_hit_ratio", "preemptions", "refused", "requests",
                                                "fetched_blocks", "tier_recomputed")})
    doc["engine"] = found[0]["engine"] if found else None
    at = [c["common"] for c in common if c["config"] == name]
    doc["at_common_rate"] = {k: mean_of(at, k) for k in ("rps", "ttft_p95_s", "hbm_utilization",
                                                         "hbm_util_queued", "mean_batch_size", "preemptions")}
    doc["points"] = [{k: p[k] for k in ("session_rate", "rps", "ttft_p95_s", "meets", "saturated")}
                     for c in mine for p in c["points"] if c["seed"] == mine[0]["seed"]]
    return doc


def ratio(configs: dict, x: str, y: str) -> float | None:
    a, b = configs.get(x, {}).get("sustainable_rps"), configs.get(y, {}).get("sustainable_rps")
    return round(a / b, 2) if a and b else None


def workload_check(opts: dict) -> dict:
    """The chat preset against the paper's ShareGPT statistics, before and under the model's window."""
    from loadgen.workloads import generate

    out = {}
    for label, window in (("unlimited", 131072), ("model_window", opts["window"])):
        trace = generate("chat", opts["duration"], seed=0, overrides={"session_rate": "0.5",
                                                                      "max_context": str(window)})
        out[label] = {"max_context": window, **conversation_shape(trace).to_dict()}
    return out


def plot(doc: dict, path: str) -> None:
    """P95 TTFT against offered load (seed 0's points) and the sustainable rate per configuration."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(doc["configs"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    for name in names[:len(CONFIGS)]:
        pts = sorted(doc["configs"][name]["points"], key=lambda p: p["rps"])
        ax1.plot([p["rps"] for p in pts], [p["ttft_p95_s"] for p in pts], marker="o", ms=4, label=name)
    ax1.axhline(doc["objective_p95_s"], color="0.4", ls="--", lw=1, label=f"objective {doc['objective_p95_s']:g} s")
    ax1.set(yscale="log", xlabel="offered load (requests/s arriving)", ylabel="P95 TTFT (s, emulated)",
            title="P95 time to first token (seed 0, points the search tried)")
    means = [doc["configs"][n]["sustainable_rps"] for n in names]
    lo = [max(m - doc["configs"][n]["spread"]["min"], 0) for m, n in zip(means, names)]
    hi = [max(doc["configs"][n]["spread"]["max"] - m, 0) for m, n in zip(means, names)]
    colors = [f"C{i}" if n in CONFIGS else "0.65" for i, n in enumerate(names)]  # ablations in grey
    ax2.barh(names, means, xerr=[lo, hi], color=colors, capsize=3)
    ax2.invert_yaxis()
    ax2.set(xlabel=f"requests/s at P95 TTFT <= {doc['objective_p95_s']:g} s (mean, min-max over "
                   f"{len(doc['seeds'])} seeds)")
    r = doc["ratios"]["flashgen_over_vllm_recompute"]
    ax2.set_title(f"Throughput at equal latency\nflashgen / vllm_recompute: {r}x (paper: 1.55-2.85x)", fontsize=10)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=8)
    fig.suptitle(f"FlashGen's configurations, chat preset: {doc['model']} on {doc['tp']} x {doc['gpu']}, "
                 f"{doc['hbm_kv_gib']:g} GiB HBM KV, {doc['host_gb']:g} GB host, {doc['ssd_gb']:g} GB SSD", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="opt-13b")
    p.add_argument("--gpu", default="a100-80gb-pcie", help="GPU preset (the paper's: A100 80GB PCIe)")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--host-gb", type=float, default=224.0, help="host DRAM for KV per replica, GB (the paper's 224)")
    p.add_argument("--ssd-gb", type=float, default=1920.0, help="SSD for KV per replica, GB (two 960 GB NVMe drives)")
    p.add_argument("--drives", type=int, default=2, help="NVMe drives the SSD tier is striped over")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    p.add_argument("--duration", type=float, default=1200.0, help="seconds of session starts per point")
    p.add_argument("--max-context", type=int, default=None,
                   help="a session ends at the turn that would exceed it (default: the model's window, "
                        "its max_position_embeddings: OPT 2,048, Llama 2 4,096)")
    p.add_argument("--slo", type=float, default=5.0, help="P95 TTFT objective, seconds")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--start-rate", type=float, default=0.1, help="first session rate tried (sessions/s)")
    p.add_argument("--max-rate", type=float, default=12.8, help="highest session rate tried")
    p.add_argument("--steps", type=int, default=5, help="bisection steps after the doubling")
    p.add_argument("--ablations", nargs="?", const="all", default="",
                   help="also FlashGen with one mechanism off at a time: all, or a comma-separated list of names")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", default="-", help="write the document here ('-': stdout)")
    p.add_argument("--plot", default=None)
    a = p.parse_args(argv)
    cost = CostModel.from_names(a.model, a.gpu if a.tp == 1 else f"{a.gpu}@tp{a.tp}")
    opts = {"model": a.model, "gpu": a.gpu, "tp": a.tp, "host_gb": a.host_gb, "ssd_gb": a.ssd_gb, "drives": a.drives,
            "utilization": a.gpu_memory_utilization, "duration": a.duration, "slo": a.slo,
            "window": a.max_context or cost.model.max_context, "start_rate": a.start_rate, "max_rate": a.max_rate,
            "steps": a.steps}
    chosen = list(ABLATIONS) if a.ablations == "all" else [x for x in a.ablations.split(",") if x]
    unknown = [x for x in chosen if x not in ABLATIONS]
    if unknown:
        p.error(f"--ablations: unknown {', '.join(unknown)}; known: {', '.join(ABLATIONS)}")
    configs = {**CONFIGS, **{name: ABLATIONS[name] for name in chosen}}
    seeds = list(range(a.seeds))
    chains = parallel([(c, f, s, opts) for c, f in configs.items() for s in seeds], a.jobs, "bisect", sustainable)
    fg = [c["best"]["session_rate"] for c in chains if c["config"] == "flashgen" and c["best"]]
    common_rate = statistics.fmean(fg) if fg else a.start_rate
    common = parallel([(c, f, common_rate, s, opts) for c, f in configs.items() for s in seeds], a.jobs,
                      "common rate", at_rate)
    out = {name: summarize(name, chains, common) for name in configs}
    budget = cost.kv_budget(a.gpu_memory_utilization, 8192, 256, 16)
    doc = {"model": a.model, "gpu": a.gpu, "tp": a.tp, "objective_p95_s": a.slo, "seeds": seeds,
           "duration_s": a.duration, "max_context": opts["window"], "hbm_kv_gib": round(budget.tp * budget.kv_bytes / GIB, 1),
           "host_gb": a.host_gb, "ssd_gb": a.ssd_gb, "ssd_drives": a.drives,
           "common_session_rate": round(common_rate, 4),
           "ratios": {"flashgen_over_vllm_recompute": ratio(out, "flashgen", "vllm_recompute"),
                      "flashgen_over_vllm": ratio(out, "flashgen", "vllm"),
                      "sched_only_over_vllm_recompute": ratio(out, "sched_only", "vllm_recompute"),
                      "flashgen_cache_over_cachedattn": ratio(out, "flashgen_cache", "cachedattn"),
                      "flashgen_over_flashgen_cache": ratio(out, "flashgen", "flashgen_cache")},
           "ablations_over_flashgen": {name: ratio(out, name, "flashgen") for name in configs if name in ABLATIONS},
           "paper": PAPER, "workload": workload_check(opts),
           "flags": {name: " ".join(config_flags(f, opts)) for name, f in configs.items()},
           "configs": out}
    text = json.dumps(doc, indent=1)
    if a.json == "-":
        print(text)
    else:
        with open(a.json, "w") as fh:
            fh.write(text + "\n")
    if a.plot:
        plot(doc, a.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
