"""What the live dashboard costs, on a real cluster.  Prints JSON.

`kvemu up`'s processes (4 replicas, embedded index, the dashboard sampling every second)
after a short replay of the ``mix`` preset: the time and size of one replica's
``/stats?top=5`` (what the router's sampler reads from every replica each second), and of
``/dashboard/data`` (what each open page reads each second) with its size per sample of
history, so the size at the full 600-sample history follows.

    python bench/bench_dashboard.py [--replicas 4] [--duration 300] [--speedup 20] [--calls 50]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import statistics
import time
import urllib.request

from kvemu.up import add_cluster_args, bring_up, validate
from loadgen.replay import Replayer
from loadgen.workloads import generate
from router.dashboard import HISTORY


def timed_get(url: str, calls: int) -> dict:
    """Median and max wall time of ``calls`` GETs as a browser sends them (gzip accepted), and the
    size on the wire and decoded."""
    times, wire, size = [], 0, 0
    for _ in range(calls):
        t0 = time.perf_counter()
        req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            body = resp.read()
            wire = len(body)
            size = len(gzip.decompress(body)) if resp.headers.get("Content-Encoding") == "gzip" else wire
        times.append(time.perf_counter() - t0)
    return {"p50_ms": round(statistics.median(times) * 1000, 2), "max_ms": round(max(times) * 1000, 2),
            "bytes_on_wire": wire, "bytes": size}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=300.0)
    p.add_argument("--speedup", type=float, default=20.0)
    p.add_argument("--calls", type=int, default=50)
    add_cluster_args(p, replicas=4)
    a = p.parse_args()
    a.port, a.capacity_blocks, a.time_scale = 0, a.capacity_blocks or 8192, 1.0 / a.speedup
    cluster = bring_up(validate(a))
    try:
        trace = generate("mix", a.duration, 1)
        trace.requests = [r for r in trace.requests if r.t < a.duration]
        records = asyncio.run(Replayer(cluster.router_url, trace, a.speedup, progress=False).run())
        data = cluster.router_url + "/dashboard/data"
        with urllib.request.urlopen(data, timeout=10) as resp:
            samples = len(json.load(resp)["history"]["t"])
        one, full = timed_get(data + "?points=1", a.calls), timed_get(data, a.calls)
        per_sample = (full["bytes"] - one["bytes"]) / max(samples - 1, 1)
        per_sample_wire = (full["bytes_on_wire"] - one["bytes_on_wire"]) / max(samples - 1, 1)
        out = {
            "replicas": a.replicas, "requests_replayed": len(records), "samples_held": samples,
            "replica_stats_top5": timed_get(cluster.replica_urls[0] + "/stats?top=5", a.calls),
            "dashboard_data_1_sample": one, "dashboard_data_all_samples": full,
            "dashboard_bytes_per_sample": round(per_sample),
            f"dashboard_bytes_at_{HISTORY}_samples_est": round(one["bytes"] + per_sample * (HISTORY - 1)),
            f"dashboard_bytes_on_wire_at_{HISTORY}_samples_est":
                round(one["bytes_on_wire"] + per_sample_wire * (HISTORY - 1)),
        }
    finally:
        cluster.stop()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
