"""fcfs against reorder (seed 001's scheduler), side by side on one trace per load. Prints JSON.

    python bench/bench_scheduler.py [--rates 0.5,1,2] [--duration 600] [--capacity 8192]

Trace: the ``chat`` preset (multi-turn conversations with long histories), seed 1, at each
``session_rate`` of ``--rates``, ``--duration`` seconds. One replica of ``--capacity`` blocks
(the default model and GPU, max 256 running), batching mode, no reuse distances. Each load runs
fcfs then reorder on the same trace in this process, so the wall-time ratio (reorder / fcfs) is
the scheduler's own cost per simulated request, measured side by side.

Per run: TTFT p50/p99, queue p99 (s), preemptions, requests finished per second from the first
arrival to the last finish (``throughput_rps``: the arrival rate while the replica keeps up),
time-averaged fraction of HBM blocks held by running requests (``hbm_utilization``), whether
the queue grew without bound, wall seconds.
"""

from __future__ import annotations

import argparse
import json
import time

from loadgen.workloads import generate
from shared.progress import ProgressBar
from sim.simulator import SimSettings, simulate

KEYS = ("block_hit_ratio", "ttft_p50_s", "ttft_p99_s", "queue_p99_s", "preemptions", "throughput_rps",
        "hbm_utilization", "saturated")


def run_one(trace, capacity: int, scheduler: str) -> dict:
    t0 = time.perf_counter()
    out = simulate(trace, SimSettings(capacity_blocks=capacity, scheduler=scheduler, reuse="off"))
    row = {k: round(out[k], 5) if isinstance(out[k], float) else out[k] for k in KEYS}
    row["wall_s"] = round(time.perf_counter() - t0, 3)
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="0.5,1,2", help="chat session_rate values (new sessions per second)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of trace per load")
    p.add_argument("--capacity", type=int, default=8192, help="replica capacity in blocks (the chat preset's longest prompt fills 8,191)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    rates = [float(x) for x in args.rates.split(",") if x.strip()]
    bar = ProgressBar("bench_scheduler", 2 * len(rates), "run", log_every_s=0.0)
    loads = []
    for rate in rates:
        trace = generate("chat", args.duration, seed=args.seed, overrides={"session_rate": repr(rate)})
        runs = {}
        for name in ("fcfs", "reorder"):
            runs[name] = run_one(trace, args.capacity, name)
            bar.update()
        f, r = runs["fcfs"], runs["reorder"]
        loads.append({"session_rate": rate, "requests": len(trace.requests), **runs,
                      "reorder_over_fcfs": {"ttft_p99": round(r["ttft_p99_s"] / f["ttft_p99_s"], 3),
                                            "queue_p99": round(r["queue_p99_s"] / f["queue_p99_s"], 3)
                                            if f["queue_p99_s"] else None,
                                            "wall": round(r["wall_s"] / f["wall_s"], 3)}})
    bar.close()
    print(json.dumps({"trace": "chat", "duration_s": args.duration, "capacity_blocks": args.capacity,
                      "loads": loads}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
