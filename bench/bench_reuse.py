"""Block accesses per second of the exact reuse-distance tracker vs SHARDS, side by side on
the same trace in one run (runs interleaved, best of --repeat), plus SHARDS' MRC error.
Prints JSON.

    python bench/bench_reuse.py [--requests 10000] [--rates 0.01,0.1] [--repeat 3]
                                [--trace mooncake-conversation]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import time

import numpy as np

from replica.core.analysis.reuse import ReuseDistanceTracker, log_capacities
from replica.core.analysis.shards import ShardsTracker


def session_trace(n_requests: int, seed: int = 0, root: int | None = None) -> list[list[int]]:
    """Multi-turn sessions over 200 shared system prompts; ~100 blocks per request, 64-bit random ids
    (tests/replica/core/analysis/test_reuse.py checks SHARDS on it too).

    ``root``, if given, is a block put first in every request (a shared chat-template block).
    """
    rng = random.Random(seed)
    prompts = [[rng.getrandbits(64) for _ in range(rng.randint(4, 16))] for _ in range(200)]
    sessions: list[dict] = []
    out = []
    for _ in range(n_requests):
        if len(sessions) < 100 or rng.random() < 0.2:
            prompt = list(rng.choice(prompts))
            s = {"blocks": prompt, "left": int(rng.expovariate(1 / 6)) + 1}
            sessions.append(s)
        else:
            s = rng.choice(sessions)
        s["blocks"].extend(rng.getrandbits(64) for _ in range(rng.randint(4, 40)))
        out.append(([root] if root is not None else []) + s["blocks"])
        s["left"] -= 1
        if s["left"] <= 0:
            sessions.remove(s)
    return out


def load_trace(path: str) -> list[list[int]]:
    with open(path) as f:
        return [json.loads(line)["hash_ids"] for line in f if line.strip()]


def run(make, trace) -> tuple[float, object]:
    tracker = make()
    t0 = time.perf_counter()
    for i, req in enumerate(trace):
        tracker.access(req, now=float(i))
    return time.perf_counter() - t0, tracker


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rates", default="0.01,0.1")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--trace", help="JSONL with hash_ids per line (default: synthetic sessions)")
    a = ap.parse_args()
    trace = load_trace(a.trace) if a.trace else session_trace(a.requests)
    accesses = sum(map(len, trace))
    rates = [float(r) for r in a.rates.split(",")]
    makers = {"exact": ReuseDistanceTracker}
    makers.update({f"shards_{r:g}": (lambda r=r: ShardsTracker(rate=r)) for r in rates})
    best = {k: float("inf") for k in makers}
    last = {}
    for _ in range(a.repeat):  # interleaved so machine noise hits every variant alike
        for name, make in makers.items():
            dt, last[name] = run(make, trace)
            best[name] = min(best[name], dt)
    exact = last["exact"]
    caps = log_capacities(2 * exact.tracked, 32)
    want = np.array([h for _, h in exact.miss_ratio_curve(caps)])
    result = {
        "bench": "reuse_distance",
        "python": platform.python_version(),
        "trace": a.trace or f"synthetic sessions, {a.requests} requests",
        "requests": len(trace),
        "block_accesses": accesses,
        "median_request_blocks": float(np.median([len(r) for r in trace])),
        "exact_accesses_per_s": round(accesses / best["exact"]),
    }
    for r in rates:
        name = f"shards_{r:g}"
        s = last[name]
        err = np.abs(np.array([h for _, h in s.miss_ratio_curve(caps)]) - want)
        result[name] = {
            "accesses_per_s": round(accesses / best[name]),
            "speedup_over_exact": round(best["exact"] / best[name], 2),
            "sampled": s.sampled,
            "tracked_blocks": s.tracked,
            "mrc_max_abs_error": round(float(err.max()), 4),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
