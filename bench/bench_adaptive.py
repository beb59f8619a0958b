"""The WAKMan (Workload Aware KVCache Manager) experiment: static LRU and S3-FIFO, the adaptive
policy and Belady over mixes of single / multi-turn / agentic sessions, cache-only virtual time;
plus WAKMan's ablations, a mid-trace shift and the cost of the sampled estimator. Prints one JSON document.

Parts (``--parts``, all by default):

* ``mixes``: 20 one-hour mixes at 1.5 requests/s (``WAKMAN_MIXES``), only the mix varying. For
  each: every policy's block hit ratio, its regret against the better static policy (points
  and % of that ratio), the share of the static gap it recovers, its wall time, and for
  adaptive the shadow cost (CPU seconds and block accesses replayed).
* ``ablations``: one workload parameter at a fixed mix (thirds, 0/50/50): turns per
  multi-turn session (2 or 8) and input length (128 or 8,192 new tokens per request);
  LRU, S3-FIFO and the first adaptive variant.
* ``shift``: agentic, then single-turn, then multi-turn sessions in one trace (one
  ``--duration`` each); which policy runs after each change, and each phase's static winner.

    .venv/bin/python bench/bench_adaptive.py --jobs 2 > adaptive.json
    .venv/bin/python bench/bench_adaptive.py --parts mixes --mixes 1,0,0 0,0,1 --duration 900

The ``mix`` preset differs from WAKMan's generator in one respect that decides the
multi-turn winner: WAKMan's users come back after "seconds to minutes", so ``WAKMAN_WORKLOAD``
sets the multi-turn gap to a median of 90 s with a narrow spread (``--set`` overrides it;
``--set multi.gap_sigma=1.0 --set multi.gap_median=30`` restores the preset's own).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import NamedTuple

from loadgen.trace import Trace
from loadgen.workloads import generate
from replica.core.build import RESPONSE_KV, EngineKnobs
from shared.errors import KvemuError
from shared.progress import ProgressBar
from sim.run import simulate
from sim.simulator import SimSettings

Mix = tuple[float, float, float]

# WAKMan's table is not in its notes, and 20 mixes cannot be symmetric in the three types
# (orbits hold 3 or 6 mixes, plus equal thirds): the 0.25 grid (15: pure types, 75/25, 50/50,
# 50/25/25), equal thirds, 60/20/20 for each type, and 20/40/40 (next to WAKMan's 0/50/50).
WAKMAN_MIXES: list[Mix] = [
    (i / 4, j / 4, (4 - i - j) / 4) for i in range(5) for j in range(5 - i)
] + [(1 / 3, 1 / 3, 1 / 3), (0.6, 0.2, 0.2), (0.2, 0.6, 0.2), (0.2, 0.2, 0.6), (0.2, 0.4, 0.4)]
WARMUP_S = 3600.0  # sessions reach a steady state before the measured hour (build_trace)
WAKMAN_WORKLOAD = {"multi.gap_median": "90", "multi.gap_sigma": "0.3"}
ABLATION_MIXES: list[Mix] = [(1 / 3, 1 / 3, 1 / 3), (0.0, 0.5, 0.5)]
ABLATIONS: dict[str, dict[str, str]] = {
    "turns=2": {"multi.turns_median": "2", "multi.turns_mean": "2"},
    "turns=8": {"multi.turns_median": "8", "multi.turns_mean": "8"},
    "input=128": {"single.payload_median": "128", "multi.prompt_median": "128", "agent.tool_median": "128"},
    "input=8192": {"single.payload_median": "8192", "multi.prompt_median": "8192", "agent.tool_median": "8192"},
}
SHIFT_PHASES: list[tuple[str, Mix]] = [("agent", (0.0, 0.0, 1.0)), ("single", (1.0, 0.0, 0.0)),
                                       ("multi", (0.0, 1.0, 0.0))]
STATIC = ("lru", "s3fifo")
# Every variant spells out margin and estimator, so a change of the policy's defaults never
# changes what a name measures. "adaptive" is the policy's defaults; "adaptive_plain" is the
# WAKMan's rule (switch on any gain, full replay).
VARIANTS: dict[str, tuple[tuple[str, object], ...]] = {
    "adaptive": (("margin", 0.01), ("estimator", "full")),
    "adaptive_plain": (("margin", 0.0), ("estimator", "full")),
    "adaptive_sampled": (("margin", 0.01), ("estimator", "sampled"), ("sample_rate", 0.1)),
    "adaptive_plain_sampled": (("margin", 0.0), ("estimator", "sampled"), ("sample_rate", 0.1)),
    "adaptive_adapt": (("margin", 0.01), ("estimator", "full"), ("adapt_interval", True)),
}


class TraceSpec(NamedTuple):
    """A generated trace: one mix, or phases of mixes one after another (``duration`` each)."""

    phases: tuple[Mix, ...]
    duration: float
    seed: int
    overrides: tuple[tuple[str, str], ...]


class Cell(NamedTuple):
    part: str
    key: str
    trace: TraceSpec
    policy: str  # a registered policy or a VARIANTS name
    capacity: int
    interval: float
    hit_mode: str
    response_kv: str  # keep (every command's default) or drop


def mix_key(mix: Mix) -> str:
    return f"{mix[0]:.2f}/{mix[1]:.2f}/{1 - mix[0] - mix[1]:.2f}"


def mix_overrides(mix: Mix) -> dict[str, str]:
    s, m, _ = mix
    return {"single_frac": repr(s), "multi_frac": repr(m), "agent_frac": repr(max(0.0, 1 - s - m))}


@functools.lru_cache(maxsize=2)
def build_trace(spec: TraceSpec) -> Trace:
    """One hour (``duration``) of steady traffic per phase, phases one after another.

    The ``mix`` preset starts sessions in [0, duration) and lets their later turns run on
    (pure multi-turn traffic would last five hours at a trickle). WAKMan's traces last one
    hour at 1.5 requests/s, so each phase is the window [WARMUP, WARMUP + duration) of a
    longer generated trace: sessions already under way at its start, cut at its end.
    """
    reqs = []
    for k, mix in enumerate(spec.phases):
        part = generate("mix", WARMUP_S + spec.duration, seed=spec.seed + k,
                        overrides={**dict(spec.overrides), **mix_overrides(mix)})
        for r in part.requests:
            if WARMUP_S <= r.t < WARMUP_S + spec.duration:
                r.t += k * spec.duration - WARMUP_S
                r.session = f"p{k}-{r.session}"
                reqs.append(r)
    reqs.sort(key=lambda r: r.t)
    return Trace(reqs, block_size=part.block_size, source="mix" if len(spec.phases) == 1 else "mix-shift")


def run_cell(cell: Cell) -> tuple[Cell, dict]:
    trace = build_trace(cell.trace)
    policy = cell.policy
    params: tuple[tuple[str, object], ...] = ()
    if policy in VARIANTS:
        policy, params = "adaptive", (("interval_s", cell.interval), *VARIANTS[cell.policy])
    t0 = time.perf_counter()
    out = simulate(trace, SimSettings(capacity_blocks=cell.capacity, cache_only=True, reuse="off",
                                      knobs=EngineKnobs(policy=policy, policy_params=params, hit_mode=cell.hit_mode,
                                                        response_kv=cell.response_kv)))
    row = {"hit_ratio": round(out["block_hit_ratio"], 5), "refused": out["refused"],
           "wall_s": round(time.perf_counter() - t0, 3)}
    if policy == "adaptive":
        pol = out["per_replica"][0]["policy"]
        row.update(switches=pol["switches"], decisions=pol["decision_counts"], shadow_blocks=pol["shadow_blocks"],
                   shadow_cpu_s=pol["shadow_cpu_s"],
                   running=[(round(d["at"]), d["running"]) for d in pol["decisions"]])
    return cell, row


def run_cells(cells: list[Cell], jobs: int) -> dict[tuple[str, str, str], dict[str, dict]]:
    """Every cell, ``jobs`` at a time, with a progress line (ETA); results by (response KV, part, key)."""
    out: dict[tuple[str, str, str], dict[str, dict]] = {}
    bar = ProgressBar("bench_adaptive", len(cells), "runs")

    def done(cell: Cell, row: dict) -> None:
        out.setdefault((cell.response_kv, cell.part, cell.key), {})[cell.policy] = row
        bar.set_postfix(f"{cell.response_kv} {cell.part} {cell.key} {cell.policy}")
        bar.update()

    if jobs <= 1:
        for c in cells:
            done(*run_cell(c))
    else:
        with ProcessPoolExecutor(max_workers=jobs) as pool:
            for fut in as_completed([pool.submit(run_cell, c) for c in cells]):
                done(*fut.result())
    bar.close()
    return out


# ---------------------------------------------------------------- scoring


def score(res: dict[str, dict]) -> dict:
    """Regret of every policy against the better static one; the static winner and gap."""
    lru, s3 = res["lru"]["hit_ratio"], res["s3fifo"]["hit_ratio"]
    best, worse, gap = max(lru, s3), min(lru, s3), abs(lru - s3)
    for r in res.values():
        r["regret_points"] = round(100 * (best - r["hit_ratio"]), 3)
        r["regret_pct"] = round(100 * (best - r["hit_ratio"]) / best, 3) if best else 0.0
        if gap > 0:
            r["gap_recovered"] = round((r["hit_ratio"] - worse) / gap, 3)
    return {"winner": "lru" if lru >= s3 else "s3fifo", "static_gap_points": round(100 * gap, 3)}


def summarize(rows: list[dict], names: Iterable[str]) -> dict:
    summary = {}
    for n in names:
        pol = [r["policies"][n] for r in rows]
        regrets = [p["regret_points"] for p in pol]
        rec = [p["gap_recovered"] for r, p in zip(rows, pol) if r["static_gap_points"] > 1 and "gap_recovered" in p]
        s = {"mean_regret_points": round(statistics.mean(regrets), 3), "max_regret_points": max(regrets),
             "mean_regret_pct": round(statistics.mean(p["regret_pct"] for p in pol), 3),
             "max_regret_pct": max(p["regret_pct"] for p in pol),
             "mean_hit_ratio": round(statistics.mean(p["hit_ratio"] for p in pol), 5),
             "median_gap_recovered_gt1pt": round(statistics.median(rec), 3) if rec else None,
             "wall_s": round(sum(p["wall_s"] for p in pol), 2)}
        if "belady" in rows[0]["policies"]:
            s["mean_gap_to_belady_points"] = round(statistics.mean(
                100 * (r["policies"]["belady"]["hit_ratio"] - p["hit_ratio"]) for r, p in zip(rows, pol)), 3)
        if "shadow_cpu_s" in pol[0]:
            s["shadow_cpu_s"] = round(sum(p["shadow_cpu_s"] for p in pol), 2)
            s["shadow_blocks"] = sum(p["shadow_blocks"] for p in pol)
            s["switches"] = sum(p["switches"] for p in pol)
        summary[n] = s
    return summary


def mix_label(mix: Mix) -> dict[str, float]:
    return {"single": round(mix[0], 3), "multi": round(mix[1], 3), "agent": round(1 - mix[0] - mix[1], 3)}


def report_mixes(results, mixes: list[Mix], names: list[str]) -> dict:
    rows = []
    for mix in mixes:
        res = results[("mixes", mix_key(mix))]
        res = {n: res[n] for n in names}
        rows.append({"mix": mix_label(mix), **score(res), "policies": res})
    summary = summarize(rows, names)
    wins = {w: sum(r["winner"] == w for r in rows) for w in STATIC}
    return {"summary": summary, "wins": wins, "mixes": rows}


def report_ablations(results, mixes: list[Mix], names: list[str]) -> list[dict]:
    rows = []
    for mix in mixes:
        for ab in ABLATIONS:
            res = {n: results[("ablations", f"{mix_key(mix)} {ab}")][n] for n in names}
            rows.append({"mix": mix_label(mix), "ablation": ab, **score(res), "policies": res})
    return rows


def follow_delays(running: list, phases: list[dict], first: str = "lru") -> list[float | None]:
    """Per phase: seconds from its start until adaptive runs the phase's static winner (0 when it
    already does; None when it never does within the phase). ``running``: (decision time, policy
    run next) pairs; a decision happens at the first request after its interval ends."""
    out: list[float | None] = []
    for k, ph in enumerate(phases):
        end = phases[k + 1]["starts_s"] if k + 1 < len(phases) else float("inf")
        before = [p for t, p in running if t < ph["starts_s"]]
        if (before[-1] if before else first) == ph["winner_alone"]:
            out.append(0.0)
            continue
        hit = [t for t, p in running if ph["starts_s"] <= t < end and p == ph["winner_alone"]]
        out.append(round(hit[0] - ph["starts_s"], 1) if hit else None)
    return out


def report_shift(results, names: list[str], duration: float, interval: float) -> dict:
    res = {n: results[("shift", "all")][n] for n in names}
    score(res)
    phases = []
    for k, (label, _mix) in enumerate(SHIFT_PHASES):
        alone = results[("shift", f"phase {label}")]
        winner = "lru" if alone["lru"]["hit_ratio"] >= alone["s3fifo"]["hit_ratio"] else "s3fifo"
        phases.append({"phase": label, "starts_s": k * duration, "winner_alone": winner,
                       "static_gap_points": round(100 * abs(alone["lru"]["hit_ratio"] - alone["s3fifo"]["hit_ratio"]), 3)})
    for n in names:
        if "running" in res[n]:
            res[n]["follow_delay_s"] = follow_delays(res[n]["running"], phases)
            res[n]["follows_within_two_intervals"] = [d is not None and d <= 2 * interval
                                                      for d in res[n]["follow_delay_s"]]
    return {"phase_s": duration, "phases": phases, "policies": res,
            "lowest_regret_online": min((n for n in names if n != "belady"), key=lambda n: res[n]["regret_points"])}


# ---------------------------------------------------------------- command line


def parse_mix(text: str) -> Mix:
    try:
        s, m, a = (float(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"error: --mixes: expected S,M,A fractions, got {text!r}") from None
    if min(s, m, a) < 0 or abs(s + m + a - 1) > 1e-3:
        raise SystemExit(f"error: --mixes: fractions must be >= 0 and sum to 1, got {text!r}")
    return (s, m, 1 - s - m)


def plan(args, names: list[str], online: list[str], response_kv: str) -> list[Cell]:
    over = tuple(sorted({**WAKMAN_WORKLOAD, **dict(kv.split("=", 1) for kv in args.set)}.items()))
    parts = set(args.parts.split(","))

    def cells(part: str, key: str, spec: TraceSpec, policies: Iterable[str]) -> list[Cell]:
        return [Cell(part, key, spec, p, args.capacity, args.interval, args.hit_mode, response_kv) for p in policies]

    out: list[Cell] = []
    if "mixes" in parts:
        for mix in args.mixes:
            out += cells("mixes", mix_key(mix), TraceSpec((mix,), args.duration, args.seed, over), names)
    if "ablations" in parts:
        for mix in args.ablation_mixes:
            for ab, extra in ABLATIONS.items():
                spec = TraceSpec((mix,), args.duration, args.seed, tuple(sorted({**dict(over), **extra}.items())))
                out += cells("ablations", f"{mix_key(mix)} {ab}", spec, online[:3])  # statics, adaptive
    if "shift" in parts:
        phases = tuple(m for _, m in SHIFT_PHASES)
        out += cells("shift", "all", TraceSpec(phases, args.duration, args.seed, over), online)
        for k, (label, mix) in enumerate(SHIFT_PHASES):  # same requests as phase k of the shift trace
            out += cells("shift", f"phase {label}", TraceSpec((mix,), args.duration, args.seed + k, over), STATIC)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="mixes,ablations,shift", help="any of mixes, ablations, shift")
    p.add_argument("--duration", type=float, default=3600.0, help="seconds of trace per mix (per shift phase)")
    p.add_argument("--capacity", type=int, default=16384, help="pool capacity in blocks")
    p.add_argument("--interval", type=float, default=900.0, help="adaptive decision interval (s)")
    p.add_argument("--hit-mode", default="prefix", choices=("prefix", "holes"),
                   help="prefix: vLLM's prefix cache, as WAKMan measures")
    p.add_argument("--mixes", nargs="*", type=parse_mix, default=WAKMAN_MIXES, metavar="S,M,A",
                   help="explicit mixes instead of WAKMan's 20")
    p.add_argument("--ablation-mixes", nargs="*", type=parse_mix, default=ABLATION_MIXES, metavar="S,M,A",
                   help="mixes the ablations run at (WAKMan's 33/33/33 and 0/50/50)")
    p.add_argument("--variants", default="adaptive,adaptive_plain,adaptive_sampled",
                   help=f"adaptive variants, any of {', '.join(VARIANTS)}")
    p.add_argument("--no-belady", action="store_true", help="skip the offline optimum")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help=f"mix preset overrides on top of {WAKMAN_WORKLOAD}")
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel (processes)")
    p.add_argument("--response-kv", default="both", choices=("both", *RESPONSE_KV),
                   help="keep: cache each response's blocks (every command's default); drop: do not; both: run"
                        " every part both ways (the default)")
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit(f"error: --variants: unknown {v!r}; choose from {', '.join(VARIANTS)}")
    online = [*STATIC, *variants]
    names = online + ([] if args.no_belady else ["belady"])
    modes = RESPONSE_KV if args.response_kv == "both" else (args.response_kv,)
    t0 = time.perf_counter()
    try:
        plans = [plan(args, names, online, m) for m in modes]  # interleaved: both modes of a trace back to back
        results = run_cells([c for same in zip(*plans) for c in same], args.jobs)
    except KvemuError as e:  # e.g. a request longer than --capacity: one line, no traceback
        raise SystemExit(f"error: {e}") from None
    doc: dict = {"duration_s": args.duration, "capacity_blocks": args.capacity, "interval_s": args.interval,
                 "hit_mode": args.hit_mode, "seed": args.seed, "jobs": args.jobs,
                 "overrides": {**WAKMAN_WORKLOAD, **dict(kv.split("=", 1) for kv in args.set)},
                 "variants": {v: dict(VARIANTS[v]) for v in variants}, "response_kv": {}}
    for mode in modes:
        doc["response_kv"][mode] = report(args, {k[1:]: v for k, v in results.items() if k[0] == mode}, names, online)
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(doc, indent=1))
    return 0


def report(args, results, names: list[str], online: list[str]) -> dict:
    """Every part run, for one response-KV mode; with the mixes, the online policy of lowest mean regret."""
    out: dict = {}
    parts = args.parts.split(",")
    if "mixes" in parts:
        out["mixes"] = report_mixes(results, args.mixes, names)
        summary = out["mixes"]["summary"]
        out["lowest_mean_regret"] = min(online, key=lambda n: summary[n]["mean_regret_points"])
    if "ablations" in parts:
        out["ablations"] = report_ablations(results, args.ablation_mixes, online[:3])
    if "shift" in parts:
        out["shift"] = report_shift(results, online, args.duration, args.interval)
    return out


if __name__ == "__main__":
    sys.exit(main())
