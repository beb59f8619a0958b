"""What N router workers cost the replicas' event feeds: reads of ``/kv/events`` per second per
replica, idle and under load, for 1, 2 and 4 workers (real processes on 127.0.0.1). Prints JSON.

Each worker keeps its own embedded index and reads every replica's feed; a read is a long poll
(answered when a batch comes, or after a second), so a quiet replica is read about once a
second per worker and a busy one once per batch it publishes per worker.

    python bench/bench_feed_reads.py [--replicas 2] [--workers 1,2,4] [--idle-s 5] [--requests 400]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.cluster import run_load, start_router, stop_all  # noqa: E402
from tests.support.procs import cluster_auth, http_json, start_replica  # noqa: E402


def reads(replicas) -> list[int]:
    return [http_json("GET", r.url + "/stats", headers=cluster_auth())[1]["events"]["reads"] for r in replicas]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--replicas", type=int, default=2)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--idle-s", type=float, default=5.0)
    ap.add_argument("--requests", type=int, default=400)
    a = ap.parse_args()
    out = {}
    for workers in (int(w) for w in a.workers.split(",")):
        reps = [start_replica(replica_id=f"r{i}") for i in range(a.replicas)]
        router = start_router([r.url for r in reps], "--workers", str(workers))
        try:
            time.sleep(2.0)  # the workers' readers settle
            before = reads(reps)
            time.sleep(a.idle_s)
            idle = reads(reps)
            bodies = [{"token_ids": list(range(i * 64, i * 64 + 64)), "max_tokens": 4} for i in range(a.requests)]
            t0 = time.monotonic()
            run_load(router.url, bodies, concurrency=4)
            loaded_s = time.monotonic() - t0
            after = reads(reps)
        finally:
            stop_all(router, *reps)
        n = len(reps)
        out[workers] = {"idle_reads_per_s_per_replica": round(sum(i - b for i, b in zip(idle, before)) / a.idle_s / n, 1),
                        "loaded_reads_per_s_per_replica": round(sum(x - i for x, i in zip(after, idle)) / loaded_s / n, 1),
                        "load_s": round(loaded_s, 2)}
    print(json.dumps({"replicas": a.replicas, "workers": out}, indent=1))


if __name__ == "__main__":
    main()
