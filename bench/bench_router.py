"""Router overhead, memory vs Redis index, measured side by side in one run.  Prints JSON.

Two clusters of real processes on 127.0.0.1, each 4 replicas (``--time-scale 0``) behind
one cache-aware router: one with the embedded (memory) index, one with a Redis index fed
by the replicas (a private ``redis-server`` on a free port, ``--save "" --appendonly no``,
started here).  Only one cluster runs at a time: the other is frozen with SIGSTOP, so its
background work (feed polling, health checks, heartbeats) does not steal CPU, and the
rounds alternate between them so drift on a shared machine hits both.

1. Added latency at a fixed offered load (default 500 req/s, open loop: each request is
   launched on its schedule, whether or not earlier ones have answered).  In each round
   the same paced load goes straight to the replicas (round robin) and through the
   router, in alternating order; ``added_p50_ms = p50(router) - p50(direct)`` over the
   pooled samples of all rounds, likewise p99.  Latency is timed from the moment the
   request is sent; ``launch_lag_ms_p99`` says how late the client's pacing was.
2. Routed requests per second, closed loop with ``--concurrency`` connections, and the
   same load sent straight to the replicas for reference (``routed_over_direct``).
3. Index lookups/s (64-block prompts) and events/s ingested: ``bench/bench_index.py``'s
   ``run()`` when it can be called, otherwise a direct measurement of ``MemoryIndex`` /
   ``RedisIndex`` (``index.source`` says which).  Both clusters are frozen meanwhile.

Where the time goes: every segment records the CPU time (psutil) of the router, the
replicas, Redis and this client process; ``router_cpu_us_per_req`` is the router's CPU per
request (background work included) and ``router_capacity_req_per_s_one_core`` the rate a
router with a core of its own could sustain at that cost.  ``foreign_cpu_util`` is the CPU
the machine spent on anything else (other tenants): ``noise`` and each round's
``other_load_cores`` say how much to trust a round, ``quietest_round`` is the least
disturbed one.  The router's /metrics give its index lookup latency (for the memory index
that histogram times a trip around the event loop, as the lookup runs in a task).
``--profile-router`` runs the routers under cProfile with a CPU clock (that run's rates are
deflated; it reports the top functions).  For a low-overhead view, point
``py-spy record -p <router pid> -f raw`` at a router while the bench runs.

CPU pinning: in the latency phase (``--pin auto``, the default, on >= 2 CPUs with
``taskset``) the routers and redis-server run on the second CPU of this process's affinity
set, the replicas and this client on the first, so the router never competes with the load
generator or the replicas it proxies to and its added latency does not mix with theirs.
In the closed-loop phase (``--pin-throughput none``, the default) placement is left to the
OS: pinned, the first core of a 2-core machine (client + 4 replicas) caps the rate before
the router does.  Affinities are switched on the running processes between phases.

A cluster whose segment loses more than 2% of its requests is declared failed (its
remaining rounds are skipped; ``failures`` holds the replicas' scheduler and event-feed
counters and any exception lines from the logs, which are then kept on disk).  Every
process is stopped at the end, also on error or SIGTERM; one that ignores SIGTERM for 10 s
is killed and named in ``killed_after_sigterm_timeout``.  Progress goes to stderr.

    python bench/bench_router.py [--quick] [--rate 500] [--rounds 3] [--concurrency 64]
                                 [--pin auto|none] [--pin-throughput auto|none]
                                 [--profile-router] [--keep-logs]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time

from routerbench.procs import Procs, cpu_layout
from routerbench.report import had_errors
from routerbench.run import main_async
from routerbench.settings import PIN_THROUGHPUT_DEFAULT, log


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run, < 30 s")
    ap.add_argument("--rate", type=int, default=500, help="offered load of the latency phase, req/s")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--latency-requests", type=int, default=None, help="requests per latency segment")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--throughput-seconds", type=float, default=None)
    ap.add_argument("--index-seconds", type=float, default=None)
    ap.add_argument("--index-ingest-batches", type=int, default=None)
    ap.add_argument("--pin", choices=("auto", "none"), default="auto", help="CPU layout of the latency phase")
    ap.add_argument("--pin-throughput", choices=("auto", "none"), default=PIN_THROUGHPUT_DEFAULT,
                    help="CPU layout of the closed-loop phase")
    ap.add_argument("--profile-router", action="store_true", help="run the routers under cProfile")
    ap.add_argument("--keep-logs", action="store_true", help="keep the processes' logs (kept anyway on errors)")
    a = ap.parse_args()
    defaults = ({"rounds": 1, "latency_requests": 600, "throughput_seconds": 0.8, "index_seconds": 0.1,
                 "index_ingest_batches": 300, "idle_seconds": 0.3} if a.quick else
                {"rounds": 3, "latency_requests": 3000, "throughput_seconds": 3.0, "index_seconds": 1.0,
                 "index_ingest_batches": 4000, "idle_seconds": 1.0})
    for k, v in defaults.items():
        if getattr(a, k, None) is None:
            setattr(a, k, v)
    return a


def run(a: argparse.Namespace, procs: Procs, layout: dict, thr_layout: dict) -> dict:
    """The measurement on uvloop when it is installed (as the router runs), else asyncio."""
    profile_dir = procs.logdir if a.profile_router else None
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main_async(a, procs, layout, thr_layout, profile_dir))
    return uvloop.run(main_async(a, procs, layout, thr_layout, profile_dir))


def main() -> None:
    a = parse_args()
    layout = cpu_layout(a.pin)
    thr_layout = cpu_layout(a.pin_throughput)
    if layout["client"] is not None:
        os.sched_setaffinity(0, {layout["client"]})
    t0 = time.perf_counter()
    result = None
    procs = Procs()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup below
    try:
        result = run(a, procs, layout, thr_layout)
    finally:
        t_stop = time.perf_counter()
        log("stopping every process")
        procs.stop_all(keep_logs=a.keep_logs or result is None or had_errors(result))
    result["timing_s"]["stop"] = round(time.perf_counter() - t_stop, 1)
    result["timing_s"]["total"] = round(time.perf_counter() - t0, 1)
    result["killed_after_sigterm_timeout"] = procs.killed
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
