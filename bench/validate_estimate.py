"""The mean-field LRU estimate (``kvemu estimate``) against the simulator (``kvemu sim
--policy session_lru``) on the ``scm`` workload, over capacity x arrival rate x mean think
time, mirroring the experiments of the mean-field LRU analysis of multi-turn conversations
(N = 2,275 blocks, λ0 = 0.5-2.0 /s, mean think time up to 135 s).  Prints JSON: every point
(estimate, simulated steady-state hit ratio, whole-trace hit ratio, absolute error) and the max / mean absolute error.

    python bench/validate_estimate.py [--capacities 2000,2275,4000] [--rates 0.5,1,1.5,2]
                                      [--thinks 15,45,135] [--set prompt_blocks=1 ...]
                                      [--sessions 20000] [--seeds 1]

The simulator's hit ratio is measured on a steady-state window: a generated trace starts
with an empty cache and no sessions in progress (too few blocks compete: hit ratio too
high), and ends with a drain (sessions started before ``duration`` keep sending turns while
no new ones arrive: too high again).  Requests at or after ``duration`` are dropped (the
process before ``duration`` is exactly stationary once warm), and the hits and accesses of a
run cut at the warm-up are subtracted from those of the full run.  Whole-conversation LRU
only depends on the order of accesses, and the scheduler admits FCFS, so both runs see the
same sequence of pool states up to the warm-up.
"""

from __future__ import annotations

import argparse
import json
import time

from loadgen.trace import Trace
from loadgen.workloads import generate
from replica.core.build import EngineKnobs
from shared.overrides import apply_overrides, parse_pairs
from sim.estimate import ScmModel, estimate
from sim.run import simulate
from sim.simulator import SimSettings


def _hits(trace: Trace, capacity: int) -> tuple[float, int]:
    # the mean-field model never caches a response's KV (the paper's prefill instance: it returns
    # as part of the next prompt), so the simulator drops it too ("keep" is every command's default)
    run = simulate(trace, SimSettings(capacity_blocks=capacity, reuse="off",
                                      knobs=EngineKnobs(policy="session_lru", response_kv="drop")))
    return run["block_hit_ratio"] * run["block_accesses"], run["block_accesses"]


def simulated_hit_ratio(trace: Trace, capacity: int, warmup_s: float, end_s: float) -> dict:
    """Steady-state hit ratio on [warmup_s, end_s), and the whole-trace one for comparison."""
    whole_hits, whole_acc = _hits(trace, capacity)
    kept = [r for r in trace.requests if r.t < end_s]
    hits, acc = _hits(Trace(kept, trace.block_size, trace.source), capacity)
    warm_hits, warm_acc = _hits(Trace([r for r in kept if r.t < warmup_s], trace.block_size, trace.source), capacity)
    return {"steady": (hits - warm_hits) / (acc - warm_acc), "whole_trace": whole_hits / whole_acc,
            "window_accesses": acc - warm_acc}


def warmup_for(model: ScmModel) -> float:
    """Long enough for the session population to settle: a session lives (M−1)·W, with mean
    p/(1−p)·E[W]; the deficit in sessions in progress decays like exp(−t / that)."""
    lifetime = model.think_mean * model.continue_prob / (1.0 - model.continue_prob)
    return max(600.0, 5.0 * lifetime)


def point(base: dict[str, str], capacity: int, rate: float, think: float, sessions: int, seed: int) -> dict:
    overrides = {**base, "arrival_rate": str(rate), "think_mean": str(think)}
    model = apply_overrides(ScmModel(), overrides)  # the preset's own names and defaults
    warmup = warmup_for(model)
    # the simulated hit ratio's noise is set by how many sessions the window holds (long
    # sessions dominate it), not by its length in seconds: size the window in sessions
    duration = warmup + sessions / rate
    trace = generate("scm", duration, seed, overrides)
    est = estimate(model.workload(), capacity)
    sim = simulated_hit_ratio(trace, capacity, warmup, duration)
    return {"capacity_blocks": capacity, "arrival_rate": rate, "think_mean": think, "seed": seed,
            "estimate": round(est.hit_ratio, 5), "sim_steady": round(sim["steady"], 5),
            "sim_whole_trace": round(sim["whole_trace"], 5), "abs_error": round(abs(est.hit_ratio - sim["steady"]), 5),
            "characteristic_time_s": round(est.characteristic_time_s, 3), "h_max": round(est.h_max, 5),
            "warmup_s": warmup, "window_s": round(duration - warmup, 1), "window_accesses": sim["window_accesses"]}


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacities", default="2000,2275,4000")
    ap.add_argument("--rates", default="0.5,1.0,1.5,2.0")
    ap.add_argument("--thinks", default="15,45,135")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="scm parameters other than arrival_rate/think_mean")
    ap.add_argument("--sessions", type=int, default=20_000, help="sessions arriving in each point's steady window")
    ap.add_argument("--seeds", type=int, default=1)
    args = ap.parse_args()
    base = {"continue_prob": "0.75", "prompt_blocks": "1", "response_blocks": "2", **parse_pairs(args.set)}
    t0 = time.perf_counter()
    points = [point(base, int(c), r, w, args.sessions, s)
              for c in _floats(args.capacities) for r in _floats(args.rates) for w in _floats(args.thinks)
              for s in range(args.seeds)]
    errors = [p["abs_error"] for p in points]
    print(json.dumps({"workload": "scm", "params": base, "variant": "theoretical", "policy": "session_lru",
                      "points": points, "max_abs_error": max(errors), "mean_abs_error": sum(errors) / len(errors),
                      "wall_s": round(time.perf_counter() - t0, 1)}, indent=1))


if __name__ == "__main__":
    main()
