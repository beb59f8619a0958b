"""The shared KV store's chaos scenario: SIGKILL the `kvemu store` process under load, start it
again later; clients lose nothing (replicas serve from their own levels meanwhile), every replica says
``"shared_store": "unreachable"`` in /health while it is gone and resyncs when it is back, nothing stays pinned."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from .cluster import REPO, Cluster, free_port, get_json
from .load import OpenLoop

STORE = ("--shared-cache-gib", "1")


def _store(c: Cluster, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "kvemu", "store", "--port", str(port), "--time-scale",
                             str(c.time_scale), *STORE], cwd=REPO, env=c.env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    c.wait(lambda: get_json(f"http://127.0.0.1:{port}/health").get("status") == "ok", "the shared store")
    return proc


def _states(c: Cluster) -> list[str]:
    return [get_json(c.replica_url(i) + "/health").get("shared_store", "?") for i in range(len(c.ports))]


def store_kill(rate: float, duration: float) -> dict:
    port = free_port()
    # small HBM (64 blocks) so the replicas evict into the store and read back from it under the load
    c = Cluster(replica_args=("--capacity-blocks", "64", "--shared-store-url", f"http://127.0.0.1:{port}", *STORE))
    store = _store(c, port)
    try:
        c.start()
        load = OpenLoop(c.url, rate, duration).start()
        time.sleep(max(load.t0 + duration / 3 - time.monotonic(), 0))
        before = get_json(f"http://127.0.0.1:{port}/stats")
        store.send_signal(signal.SIGKILL)
        store.wait()
        down_s = c.wait(lambda: set(_states(c)) == {"unreachable"}, "every replica sees the store gone")
        time.sleep(max(load.t0 + 2 * duration / 3 - time.monotonic(), 0))
        t = time.monotonic()
        store = _store(c, port)
        back_s = time.monotonic() - t + c.wait(lambda: set(_states(c)) == {"ok"}, "every replica resyncs")
        out = load.join()
        stats = [get_json(c.replica_url(i) + "/stats", timeout=5.0) for i in range(len(c.ports))]
        return {**out, "store_writes_before_kill": before.get("writes"), "store_reads_before_kill": before.get("reads"),
                "replicas_see_it_down_s": round(down_s, 3), "replicas_resynced_s": round(back_s, 3),
                "replica_store_failures": sum(s["shared_store"]["failures"] for s in stats),
                "pinned_blocks_after": sum(s["pinned_blocks"] for s in stats)}
    finally:
        c.stop()
        if store.poll() is None:
            store.kill()
            store.wait()
