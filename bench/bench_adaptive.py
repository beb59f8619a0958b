"""The seed-004 experiment (WAKMan): static LRU and S3-FIFO against the adaptive policy and its
variants over mixes of single / multi-turn / agentic sessions, cache-only virtual time.

For each mix: hit ratio (blocks) of every policy, its regret against the better static one
(in points, and as a fraction of that policy's ratio), the wall time of each run, and the
shadow cost (block accesses replayed per candidate). Prints one JSON document.

    .venv/bin/python bench/bench_adaptive.py --duration 1800 --capacity 16384 --step 0.5
    .venv/bin/python bench/bench_adaptive.py --mixes 1,0,0 0,0,1 --variants plain,sampled
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time

from loadgen.trace import Trace
from loadgen.workloads import generate
from sim.simulator import SimSettings, simulate

# Every variant spells out margin and estimator, so a change of the policy's defaults
# never changes what "plain" (the seed's rule) measures.
VARIANTS: dict[str, tuple[tuple[str, object], ...]] = {
    "plain": (("margin", 0.0), ("estimator", "full")),
    "sampled": (("margin", 0.0), ("estimator", "sampled"), ("sample_rate", 0.1)),
    "margin": (("margin", 0.01), ("estimator", "full")),
    "adapt": (("margin", 0.0), ("estimator", "full"), ("adapt_interval", True)),
    "margin_sampled": (("margin", 0.01), ("estimator", "sampled"), ("sample_rate", 0.1)),
}


def mix_grid(step: float) -> list[tuple[float, float, float]]:
    n = round(1 / step)
    grid = [(i / n, j / n, (n - i - j) / n) for i, j in itertools.product(range(n + 1), repeat=2) if i + j <= n]
    if (1 / 3, 1 / 3, 1 / 3) not in grid:
        grid.append((1 / 3, 1 / 3, 1 / 3))
    return grid


def run_one(trace, capacity: int, policy: str, params=()) -> dict:
    t0 = time.perf_counter()
    out = simulate(trace, SimSettings(capacity_blocks=capacity, policy=policy, policy_params=params,
                                      cache_only=True, reuse="off"))
    wall = time.perf_counter() - t0
    pol = out["per_replica"][0]["policy"]
    row = {"hit_ratio": round(out["block_hit_ratio"], 5), "wall_s": round(wall, 3)}
    if policy == "adaptive":
        row.update(switches=pol["switches"], decisions=pol["decision_counts"], shadow_blocks=pol["shadow_blocks"])
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=1800.0, help="seconds of trace per mix")
    p.add_argument("--capacity", type=int, default=16384, help="pool capacity in blocks")
    p.add_argument("--interval", type=float, default=300.0, help="adaptive decision interval (s)")
    p.add_argument("--step", type=float, default=0.5, help="mix grid step (0.25: 15 mixes + thirds)")
    p.add_argument("--mixes", nargs="*", metavar="S,M,A", help="explicit mixes instead of the grid")
    p.add_argument("--variants", default="plain,sampled,margin,adapt")
    p.add_argument("--belady", action="store_true", help="also the offline optimum (slower)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="mix preset overrides")
    p.add_argument("--shift", action="store_true",
                   help="instead: one trace whose mix changes (agentic -> single -> multi), --duration each")
    args = p.parse_args(argv)
    if args.shift:
        return shift(args)
    mixes = ([tuple(float(x) for x in m.split(",")) for m in args.mixes] if args.mixes else mix_grid(args.step))
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    extra = dict(kv.split("=", 1) for kv in args.set)
    rows = []
    for s, m, a in mixes:
        over = {"single_frac": repr(s), "multi_frac": repr(m), "agent_frac": repr(1 - s - m), **extra}
        trace = generate("mix", args.duration, seed=args.seed, overrides=over)
        res = {"lru": run_one(trace, args.capacity, "lru"), "s3fifo": run_one(trace, args.capacity, "s3fifo")}
        for v in variants:
            res[f"adaptive_{v}"] = run_one(trace, args.capacity, "adaptive",
                                           (("interval_s", args.interval), *VARIANTS[v]))
        if args.belady:
            res["belady"] = run_one(trace, args.capacity, "belady")
        best = max(res["lru"]["hit_ratio"], res["s3fifo"]["hit_ratio"])
        gap = abs(res["lru"]["hit_ratio"] - res["s3fifo"]["hit_ratio"])
        worse = min(res["lru"]["hit_ratio"], res["s3fifo"]["hit_ratio"])
        for r in res.values():
            r["regret_points"] = round(100 * (best - r["hit_ratio"]), 3)
            if gap > 0:
                r["gap_recovered"] = round((r["hit_ratio"] - worse) / gap, 3)
        rows.append({"mix": {"single": round(s, 3), "multi": round(m, 3), "agent": round(a, 3)},
                     "requests": len(trace.requests), "winner": "lru" if res["lru"]["hit_ratio"] >= best else "s3fifo",
                     "static_gap_points": round(100 * gap, 3), "policies": res})
        print(f"{s:.2f}/{m:.2f}/{a:.2f} " + " ".join(f"{k}={v['hit_ratio']:.4f}" for k, v in res.items()),
              file=sys.stderr)
    names = list(rows[0]["policies"])
    summary = {}
    for n in names:
        regrets = [r["policies"][n]["regret_points"] for r in rows]
        rec = [r["policies"][n]["gap_recovered"] for r in rows
               if r["static_gap_points"] > 1 and "gap_recovered" in r["policies"][n]]
        summary[n] = {"mean_regret_points": round(statistics.mean(regrets), 3), "max_regret_points": max(regrets),
                      "mean_hit_ratio": round(statistics.mean(r["policies"][n]["hit_ratio"] for r in rows), 5),
                      "median_gap_recovered_gt1pt": round(statistics.median(rec), 3) if rec else None,
                      "wall_s": round(sum(r["policies"][n]["wall_s"] for r in rows), 2)}
    print(json.dumps({"duration_s": args.duration, "capacity_blocks": args.capacity, "interval_s": args.interval,
                      "seed": args.seed, "overrides": extra, "summary": summary,
                      "wins": {w: sum(r["winner"] == w for r in rows) for w in ("lru", "s3fifo")}, "mixes": rows},
                     indent=1))
    return 0


def shift(args) -> int:
    """The seed does not run this: the mix changes mid-trace; which policy runs after each change."""
    phases = [(0.0, 0.0, 1.0), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0)]
    reqs = []
    for k, (s, m, a) in enumerate(phases):
        part = generate("mix", args.duration, seed=args.seed + k,
                        overrides={"single_frac": repr(s), "multi_frac": repr(m), "agent_frac": repr(a)})
        for r in part.requests:
            r.t += k * args.duration
        reqs += part.requests
    reqs.sort(key=lambda r: r.t)
    trace = Trace(reqs, block_size=part.block_size, source="mix-shift")
    res = {"lru": run_one(trace, args.capacity, "lru"), "s3fifo": run_one(trace, args.capacity, "s3fifo")}
    runs = {}
    for v in [v.strip() for v in args.variants.split(",") if v.strip()]:
        params = (("interval_s", args.interval), *VARIANTS[v])
        out = simulate(trace, SimSettings(capacity_blocks=args.capacity, policy="adaptive", policy_params=params,
                                          cache_only=True, reuse="off"))
        pol = out["per_replica"][0]["policy"]
        res[f"adaptive_{v}"] = {"hit_ratio": round(out["block_hit_ratio"], 5), "switches": pol["switches"]}
        runs[f"adaptive_{v}"] = [(round(d["at"]), d["running"]) for d in pol["decisions"]]
    best = max(res["lru"]["hit_ratio"], res["s3fifo"]["hit_ratio"])
    for r in res.values():
        r["regret_points"] = round(100 * (best - r["hit_ratio"]), 3)
    print(json.dumps({"phases": ["agent", "single", "multi"], "phase_s": args.duration, "capacity_blocks":
                      args.capacity, "interval_s": args.interval, "policies": res, "running": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
