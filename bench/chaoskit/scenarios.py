"""The chaos scenarios: each starts its own cluster, runs the open-loop load, injects one
fault, and returns what the clients saw plus the recovery times and RSS of every process."""

from __future__ import annotations

import asyncio
import json
import os
import selectors
import signal
import socket
import threading
import time
import urllib.request

from .abandon import abandoning_client
from .cluster import Cluster, get_json
from .load import OpenLoop
from .probe import frozen_replica, pinning_client, replica_kill_up, store_kill_up
from .ssrf import ssrf_probe
from .store import store_kill


def _with_cluster(cluster: Cluster, fn) -> dict:
    cluster.start()
    try:
        rss0 = cluster.rss()
        out = fn(cluster)
        out["rss_mb"] = {"start": rss0, "end": cluster.rss()}
        return out
    finally:
        cluster.stop()


def _at(t0: float, offset: float) -> None:
    time.sleep(max(t0 + offset - time.monotonic(), 0))


def replica_kill(index: str, rate: float, duration: float) -> dict:
    """SIGKILL a replica a third of the way in, start it again at two thirds."""
    def run(c: Cluster) -> dict:
        load = OpenLoop(c.url, rate, duration).start()
        _at(load.t0, duration / 3)
        c.kill_replica(0)
        out_s = c.wait(lambda: c.healthy() == len(c.ports) - 1, "router takes the dead replica out")
        _at(load.t0, 2 * duration / 3)
        t = time.monotonic()
        c.start_replica(0)
        back_s = time.monotonic() - t + c.wait(lambda: c.healthy() == len(c.ports), "the replica rejoins")
        return {**load.join(), "index_consistent_s": round(out_s, 3), "rejoined_s": round(back_s, 3)}

    return _with_cluster(Cluster(index=index), run)


def redis_restart(rate: float, duration: float, outage_s: float = 3.0) -> dict:
    """Stop redis-server for ``outage_s`` mid-run; count what clients lost and how long until
    routers use the index again (lookups succeed) after it returns."""
    def run(c: Cluster) -> dict:
        load = OpenLoop(c.url, rate, duration).start()
        _at(load.t0, duration / 3)
        assert c.redis is not None, "a cluster with the Redis index"
        c.redis.stop()
        time.sleep(outage_s)
        c.redis.start()
        t = time.monotonic()
        base = _metric(c.url, "kvemu_router_load_only_decisions_total")

        def lookups_back() -> bool:  # two consecutive 0.2 s windows without a load-only decision
            nonlocal base
            time.sleep(0.2)
            now = _metric(c.url, "kvemu_router_load_only_decisions_total")
            quiet, base = now == base, now
            return quiet
        c.wait(lookups_back, "index lookups succeed again")
        back = time.monotonic() - t - 0.4  # less the two quiet windows that confirmed it
        return {**load.join(), "outage_s": outage_s, "index_consistent_s": round(max(back, 0.0), 3)}

    return _with_cluster(Cluster(index="redis"), run)


def router_kill(rate: float, duration: float, workers: int = 2) -> dict:
    """SIGKILL one of the router's workers half way; its supervisor starts another."""
    def run(c: Cluster) -> dict:
        load = OpenLoop(c.url, rate, duration).start()
        _at(load.t0, duration / 2)
        before = set(c.router_workers())
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        # Until a worker started after the kill answers /health (it has its own pid).
        replaced = c.wait(lambda: get_json(c.url + "/health", timeout=1.0).get("pid") not in before,
                          "the supervisor restarts the worker")
        return {**load.join(), "workers": workers, "replaced_s": round(replaced, 3)}

    return _with_cluster(Cluster(workers=workers), run)


def busy_replicas(rate: float, duration: float) -> dict:
    """Replicas with one running and one waiting slot, at --time-scale 1, under more load than they
    take: 503 + Retry-After is overload,
    so the router retries elsewhere and never takes one out."""
    def run(c: Cluster) -> dict:
        out = OpenLoop(c.url, rate, duration).start().join()
        out["router_replica_busy"] = _metric(c.url, "kvemu_router_replica_busy_total")
        out["router_replica_failures"] = _metric(c.url, "kvemu_router_replica_failures_total")
        return out

    # a dense 70B model: each request holds its slot for a few hundred ms of decode (the default
    # MoE preset decodes a dozen tokens in ~20 ms, too fast to keep a slot busy)
    return _with_cluster(Cluster(time_scale=1.0, replica_args=("--max-running", "1", "--max-waiting", "1",
                                                               "--model", "llama-3-70b")), run)


def slow_clients(rate: float, duration: float, n: int = 100, readers: int = 4) -> dict:
    """``n`` connections to the router and ``n`` to a replica, each sending its request head a
    byte every 0.5 s (header timeout 2 s here), and ``readers`` + ``readers`` that ask for 16
    long streams and read nothing (write timeout 2 s, counted from when the server's buffers
    for them are full); the load runs meanwhile."""
    def run(c: Cluster) -> dict:
        load = OpenLoop(c.url, rate, duration).start()
        results: dict[str, list] = {"router": [], "replica": [], "router_reader": [], "replica_reader": []}
        targets = {"router": (c.url, "kvemu_router_connections_cut_total"),
                   "replica": (c.replica_url(0), "kvemu_connections_cut_total")}
        threads = [threading.Thread(target=_slowloris, args=(url, n, results[k])) for k, (url, _) in targets.items()]
        threads += [threading.Thread(target=_slow_readers, args=(url, readers, results[f"{k}_reader"], name))
                    for k, (url, name) in targets.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        out = load.join()
        for k, held in results.items():  # router_slow_connections, router_cut_within_s_max, router_readers, ...
            out[f"{k}_slow_connections" if "_reader" not in k else f"{k}s"] = n if "_reader" not in k else readers
            out[f"{k}_cut_within_s_max"] = round(max(held), 2) if held else None
        return out

    limits = ("--header-timeout", "2", "--body-timeout", "2", "--write-timeout", "2")
    # --time-scale 0: the streams come as fast as they are read, so an unread one fills the
    # socket buffers (4 MB on loopback) within a second and the write deadline starts
    # 8,192 blocks: a 65,536-token stream's decode KV (4,097 blocks of 16) must fit, or it is refused
    return _with_cluster(Cluster(time_scale=0.0, replica_args=(*limits, "--capacity-blocks", "8192"),
                                 router_args=limits), run)


def _slow_readers(url: str, n: int, held: list, metric: str) -> None:
    """``n`` connections that pipeline 16 streamed completions each (6.4 MB) and read nothing;
    ``held`` gets the seconds until the server counted ``n`` of its connections cut for not
    reading (a client with a zero window may not see the reset until it reads)."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": "tell me everything", "max_tokens": 65536, "stream": True}).encode()
    ask = 16 * (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    cut_before = _metric(url, metric + '{reason="write_timeout"}')
    t0, socks = time.monotonic(), []
    for _ in range(n):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((host, int(port)))
        s.sendall(ask)
        socks.append(s)
    while time.monotonic() - t0 < 30 and _metric(url, metric + '{reason="write_timeout"}') - cut_before < n:
        time.sleep(0.1)
    held.append(time.monotonic() - t0)
    for s in socks:
        s.close()


def _slowloris(url: str, n: int, held: list) -> None:
    """``n`` connections sending a request head a byte every 0.5 s; ``held`` gets, for each, the
    seconds from its opening until the server closed it, seen when it happens (a selector waits on
    every connection between sends), not at the next send."""
    host, port = url.removeprefix("http://").split(":")
    sel = selectors.DefaultSelector()
    opened: dict[socket.socket, float] = {}
    for _ in range(n):
        s = socket.create_connection((host, int(port)), timeout=5)
        s.setblocking(False)
        opened[s] = time.monotonic()
        sel.register(s, selectors.EVENT_READ)
    cut: dict[socket.socket, float] = {}

    def close(s: socket.socket) -> None:
        cut[s] = time.monotonic() - opened[s]
        sel.unregister(s)

    head = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" * 4
    start = min(opened.values())
    for k in range(len(head)):
        for s in [s for s in opened if s not in cut]:
            try:
                s.send(head[k:k + 1])
            except BlockingIOError:
                pass
            except OSError:
                close(s)
        next_send = time.monotonic() + 0.5
        while (left := next_send - time.monotonic()) > 0 and len(cut) < n:
            for key, _ in sel.select(left):
                try:
                    if key.fileobj.recv(4096) == b"":  # type: ignore[union-attr]
                        close(key.fileobj)  # type: ignore[arg-type]
                except BlockingIOError:
                    pass
                except OSError:
                    close(key.fileobj)  # type: ignore[arg-type]
        if len(cut) == n or time.monotonic() - start > 30:
            break
    for s, t0 in opened.items():
        held.append(cut.get(s, time.monotonic() - t0))
        s.close()
    sel.close()


def big_prompts(rate: float, duration: float, senders: int = 2) -> dict:
    """``senders`` clients sending ~1M-token prompts back to back during the load; the router's
    /health latency is sampled every 0.1 s."""
    huge = json.dumps({"prompt": " ".join(f"w{i % 5000}" for i in range(1_000_000)), "max_tokens": 1}).encode()

    def run(c: Cluster) -> dict:
        stop = threading.Event()
        codes: dict[int, int] = {}

        def sender():
            while not stop.is_set():
                req = urllib.request.Request(c.url + "/v1/completions", data=huge,
                                             headers={"Content-Type": "application/json"})
                try:
                    with urllib.request.urlopen(req, timeout=60) as resp:
                        code = resp.status
                except urllib.error.HTTPError as err:
                    code = err.code
                except OSError as err:  # also the teardown cutting a prompt still in flight
                    code = "during teardown" if stop.is_set() else type(err).__name__
                codes[code] = codes.get(code, 0) + 1

        threads = [threading.Thread(target=sender, daemon=True) for _ in range(senders)]
        load = OpenLoop(c.url, rate, duration).start()
        for t in threads:
            t.start()
        health = []
        while time.monotonic() - load.t0 < duration:
            asked = time.monotonic()
            get_json(c.url + "/health", timeout=10)
            health.append(time.monotonic() - asked)
            time.sleep(0.1)
        stop.set()
        for t in threads:
            t.join(2)  # a huge prompt still in flight is not waited for
        health.sort()
        return {**load.join(), "huge_prompt_status": codes, "health_ms_p50": round(health[len(health) // 2] * 1000, 1),
                "health_ms_max": round(health[-1] * 1000, 1)}

    # the replicas emulate a 1M-token prefill per huge prompt: at 0.005 of real time they finish it in
    # seconds, not the ~35 s that kept the short suite waiting (what is measured is the router)
    return _with_cluster(Cluster(time_scale=0.005, replica_args=("--capacity-blocks", "70000")), run)


def soak(rate: float, duration: float, every: float = 5.0, workers: int = 2) -> dict:
    """The load for ``duration`` seconds through ``workers`` router workers, RSS of every process
    sampled every ``every`` s; RSS is flat when the last half grew by at most 10 %. At the end the
    router's own count (every worker's, one set) is checked against what was answered."""
    def run(c: Cluster) -> dict:
        load = OpenLoop(c.url, rate, duration).start()
        samples = []
        while load.thread.is_alive() and time.monotonic() - load.t0 < duration:
            samples.append((round(time.monotonic() - load.t0, 1), c.rss()))
            time.sleep(every)
        out = load.join()
        samples.append((round(time.monotonic() - load.t0, 1), c.rss()))
        half = samples[len(samples) // 2][1]
        end = samples[-1][1]
        growth = {k: round((end[k] - half[k]) / half[k] * 100, 1) for k in end if k in half}
        reps = [k for k in growth if k.startswith("replica")]
        out.update({"rss_mb_samples": samples, "rss_growth_last_half_pct": growth,
                    "replica_rss_flat": all(growth[k] <= 10.0 for k in reps), "workers": workers,
                    "router_requests_total": [_metric(c.url, "kvemu_router_requests_total") for _ in range(3)]})
        return out

    return _with_cluster(Cluster(workers=workers), run)


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


SCENARIOS = {
    "replica_kill_memory": lambda a: replica_kill("memory", a.rate, a.duration),
    "replica_kill_redis": lambda a: replica_kill("redis", a.rate, a.duration),
    "redis_restart": lambda a: redis_restart(a.rate, a.duration),
    "router_kill": lambda a: router_kill(a.rate, a.duration),
    "busy_replicas": lambda a: busy_replicas(a.rate, a.duration),
    "slow_clients": lambda a: slow_clients(a.rate, a.duration, readers=2 if a.short else 4),
    "big_prompts": lambda a: big_prompts(a.rate, a.duration, senders=1 if a.short else 2),
    "soak": lambda a: soak(a.rate, a.soak_seconds, workers=a.router_workers),
    "store_kill": lambda a: store_kill(a.rate, a.duration),  # the shared KV store (bench/chaoskit/store.py)
    # the operator's probes: `kvemu up` as a user starts it (bench/chaoskit/probe.py, ssrf.py); --probe-rate,
    # --probe-duration
    "ssrf_probe": lambda a: ssrf_probe(),
    "pinning_client": lambda a: pinning_client(16 if a.short else 32, a.probe_rate, a.probe_duration),
    "abandoning_client": lambda a: abandoning_client(20 if a.short else 40, a.probe_rate / 2),
    "store_kill_up": lambda a: store_kill_up(a.probe_rate, a.probe_duration),
    "replica_kill_up": lambda a: replica_kill_up(a.probe_rate, a.probe_duration),
    "frozen_replica": lambda a: frozen_replica(a.probe_rate, max(a.probe_duration, 15.0)),
}
PROBES = ("ssrf_probe", "pinning_client", "abandoning_client", "store_kill_up", "replica_kill_up", "frozen_replica")

_ = asyncio  # the load runs its own loop in a thread
