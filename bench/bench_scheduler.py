"""fcfs against reorder (FlashGen's scheduler), side by side on one trace per load. Prints JSON.

    python bench/bench_scheduler.py [--rates 0.5,1,2] [--duration 600] [--capacity 8192]
                                    [--host-blocks 0]

Trace: the ``chat`` preset (multi-turn conversations with long histories), seed 1, at each
``session_rate`` of ``--rates``, ``--duration`` seconds. One replica of ``--capacity`` blocks
(the default model and GPU, max 256 running), batching mode, no reuse distances; with
``--host-blocks N`` a host DRAM tier of N blocks below it (exclusive, fetch auto), so a
preempted request comes back by fetching what the head evicted instead of recomputing it. Each load runs
fcfs then reorder on the same trace in this process, so the wall-time ratio (reorder / fcfs) is
the scheduler's own cost per simulated request, measured side by side.

Per run: TTFT p50/p99, queue p99 (s), preemptions, requests finished per second from the first
arrival to the last finish (``throughput_rps``: the arrival rate while the replica keeps up),
time-averaged fraction of HBM blocks held by running requests (``hbm_utilization``), whether
the queue grew without bound, wall seconds; the tokens admissions prefilled, and of them those
re-admissions after a preemption prefilled again; and, over the steps that start with
``BACKLOG`` or more requests waiting, their emulated seconds and the fraction of blocks held
by running requests (what a backlog waits for).
"""

from __future__ import annotations

import argparse
import json
import time

from loadgen.workloads import generate
from replica.core.build import EngineKnobs
from replica.core.tiers.stack import TierSettings
from shared.progress import ProgressBar
from sim.simulator import SimSettings, Simulation

BACKLOG = 20
KEYS = ("block_hit_ratio", "ttft_p50_s", "ttft_p95_s", "ttft_p99_s", "queue_p99_s", "preemptions", "throughput_rps",
        "hbm_utilization", "saturated")


def run_one(trace, capacity: int, scheduler: str, host_blocks: int = 0) -> dict:
    t0 = time.perf_counter()
    sim = Simulation(trace, SimSettings(capacity_blocks=capacity, reuse="off",
                                        knobs=EngineKnobs(scheduler=scheduler, tiers=TierSettings(host_blocks=host_blocks))))
    sched = sim.replicas[0].sched
    backlog = {"s": 0.0, "held_block_s": 0.0}
    plain_step = sched.step

    def step(now, horizon=float("inf")):
        busy = sched.num_waiting >= BACKLOG
        res = plain_step(now, horizon)
        if busy:
            backlog["s"] += res.duration
            backlog["held_block_s"] += (sched.pool.pinned + sched.pool.private) * res.duration
        return res

    sched.step = step  # type: ignore[method-assign]  # measuring only; the run is the same
    out = sim.run()
    wall = time.perf_counter() - t0
    row = {k: round(out[k], 5) if isinstance(out[k], float) else out[k] for k in KEYS}
    st = sched.stats()
    row.update(prefill_tokens=st["prefill_tokens"], readmission_prefill_tokens=st["readmission_prefill_tokens"],
               refused=st["refused"],
               backlog_s=round(backlog["s"], 1),
               backlog_held_fraction=round(backlog["held_block_s"] / (backlog["s"] * capacity), 4)
               if backlog["s"] else None,
               wall_s=round(wall, 3))
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rates", default="0.5,1,2", help="chat session_rate values (new sessions per second)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of trace per load")
    p.add_argument("--capacity", type=int, default=8192, help="replica capacity in blocks (the chat preset's longest prompt fills 8,191)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--host-blocks", type=int, default=0, help="host DRAM tier below HBM, in blocks (0: none)")
    args = p.parse_args(argv)
    rates = [float(x) for x in args.rates.split(",") if x.strip()]
    bar = ProgressBar("bench_scheduler", 2 * len(rates), "run", log_every_s=0.0)
    loads = []
    for rate in rates:
        trace = generate("chat", args.duration, seed=args.seed, overrides={"session_rate": repr(rate)})
        runs = {}
        for name in ("fcfs", "reorder"):
            runs[name] = run_one(trace, args.capacity, name, args.host_blocks)
            bar.update()
        f, r = runs["fcfs"], runs["reorder"]
        loads.append({"session_rate": rate, "requests": len(trace.requests), **runs,
                      "reorder_over_fcfs": {"ttft_p99": round(r["ttft_p99_s"] / f["ttft_p99_s"], 3),
                                            "queue_p99": round(r["queue_p99_s"] / f["queue_p99_s"], 3)
                                            if f["queue_p99_s"] else None,
                                            "wall": round(r["wall_s"] / f["wall_s"], 3)}})
    bar.close()
    print(json.dumps({"trace": "chat", "duration_s": args.duration, "capacity_blocks": args.capacity,
                      "host_blocks": args.host_blocks,
                      "loads": loads}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
