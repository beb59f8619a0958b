"""A private redis-server and the two clusters under test (4 replicas + 1 router each)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

from .load import new_session
from .procs import ALL_CPUS, Procs, free_port
from .settings import CAPACITY_BLOCKS, REPLICAS


async def wait_http_ok(session: aiohttp.ClientSession, url: str, procs: Procs, proc: subprocess.Popen,
                       check=None, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited with {proc.returncode}: {procs.log_tail(proc)}")
        try:
            async with session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
                if r.status == 200:
                    body = await r.json()
                    if check is None or check(body):
                        return body
        except (TimeoutError, aiohttp.ClientError, ValueError):
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not become healthy: {procs.log_tail(proc)}")


class PrivateRedis:
    def __init__(self, procs: Procs, cpu: int | None) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("redis-server is not on PATH")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="kvemu-bench-router-redis-")
        self.proc = procs.start("redis-server", [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                          "--appendonly", "no", "--dir", self.dir], cpu)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    async def wait(self) -> str:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                _, w = await asyncio.open_connection("127.0.0.1", self.port)
                w.close()
                import redis

                return redis.Redis(port=self.port).info("server")["redis_version"]
            except (OSError, Exception):
                await asyncio.sleep(0.05)
        raise RuntimeError("private redis-server did not start")


class Cluster:
    """4 replicas + 1 router, with the memory index or a Redis index."""

    def __init__(self, name: str, procs: Procs, layout: dict, redis_url: str | None, profile_dir: Path | None):
        self.name = name
        self.procs = procs
        self.redis_url = redis_url
        self.cluster_ns = f"benchrouter{os.getpid()}{name}"
        self.replica_urls: list[str] = []
        self.replica_procs: list[subprocess.Popen] = []
        self.profile_path = profile_dir / f"router-{name}.prof" if profile_dir else None
        self.extra: list[subprocess.Popen] = []  # redis-server for the redis cluster
        py = sys.executable
        for i in range(REPLICAS):
            port = free_port()
            cmd = [py, "-m", "kvemu", "replica", "--port", str(port), "--capacity-blocks", str(CAPACITY_BLOCKS),
                   "--time-scale", "0", "--replica-id", f"{name}-r{i}"]
            if redis_url:
                cmd += ["--index", redis_url, "--cluster", self.cluster_ns]
            self.replica_procs.append(procs.start(f"{name}-replica{i}", cmd, layout["replicas"]))
            self.replica_urls.append(f"http://127.0.0.1:{port}")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        head = [py, "-c", PROFILE_SNIPPET, str(self.profile_path)] if self.profile_path else [py, "-m", "kvemu", "router"]
        cmd = [*head, "--port", str(self.port), "--replicas", ",".join(self.replica_urls),
               "--routing", "cache_aware", "--index", redis_url or "memory", "--seed", "1"]
        if redis_url:
            cmd += ["--cluster", self.cluster_ns]
        self.router_proc = procs.start(f"{name}-router", cmd, layout["router"])
        self.ps_router = psutil.Process(self.router_proc.pid)
        self.ps_replicas = [psutil.Process(p.pid) for p in self.replica_procs]
        self.ps_redis: list[psutil.Process] = []

    def all_procs(self) -> list[subprocess.Popen]:
        return [*self.replica_procs, self.router_proc, *self.extra]

    async def wait_ready(self, session: aiohttp.ClientSession) -> None:
        for url, p in zip(self.replica_urls, self.replica_procs):
            await wait_http_ok(session, url, self.procs, p)
        await wait_http_ok(session, self.url, self.procs, self.router_proc,
                           check=lambda b: b.get("healthy_replicas") == REPLICAS)

    def freeze(self) -> None:
        for p in [*self.replica_procs, self.router_proc]:
            os.kill(p.pid, signal.SIGSTOP)
        for p in self.extra:  # Redis last, so replies to calls in flight can still arrive
            os.kill(p.pid, signal.SIGSTOP)

    async def thaw(self, session: aiohttp.ClientSession) -> None:
        for p in self.extra:
            os.kill(p.pid, signal.SIGCONT)
        for p in [*self.replica_procs, self.router_proc]:
            os.kill(p.pid, signal.SIGCONT)
        await asyncio.sleep(0.3)
        await wait_http_ok(session, self.url, self.procs, self.router_proc,
                           check=lambda b: b.get("healthy_replicas") == REPLICAS, timeout=10)

    async def _replica_stats(self, session: aiohttp.ClientSession) -> list[dict]:
        async def one(url):
            async with session.get(url + "/stats?top=1") as r:
                return await r.json()

        return await asyncio.gather(*(one(u) for u in self.replica_urls))

    async def replica_snapshot(self) -> list[dict]:
        """Each replica's scheduler and event feed, or why it did not answer /stats."""
        out = []
        async with new_session() as s:
            for url in self.replica_urls:
                try:
                    async with s.get(url + "/stats?top=1", timeout=aiohttp.ClientTimeout(total=3)) as r:
                        st = await r.json()
                    out.append({"url": url, "scheduler": {k: st["scheduler"].get(k) for k in
                                                          ("running", "waiting", "finished", "steps")},
                                "events": st.get("events")})
                except (TimeoutError, aiohttp.ClientError, ValueError, KeyError) as exc:
                    out.append({"url": url, "error": f"{type(exc).__name__}: {exc}"[:200]})
        return out

    async def quiesce(self, session: aiohttp.ClientSession, timeout: float = 5.0) -> None:
        """Let event shipping/polling catch up before freezing, so no index call is cut in half."""
        if not self.redis_url:
            await asyncio.sleep(0.1)  # > the router's 20 ms feed poll interval
            return
        last = None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = await self._replica_stats(session)
            shipped = [x.get("index_shipper", {}).get("shipped_batches") for x in st]
            if last == shipped and all(x["events"]["queued_batches"] == 0 for x in st):
                return
            last = shipped
            await asyncio.sleep(0.1)

    async def health_report(self, session: aiohttp.ClientSession) -> dict:
        """Counters that would show the bench disturbed the cluster (all should stay 0)."""
        m = await self.router_metrics(session)
        keys = ("index_errors", "load_only_decisions", "retries", "event_gaps", "replica_failures",
                "replica_restarts")
        out = {k: int(m.get(f"kvemu_router_{k}_total", m.get(f"kvemu_router_{k}", 0))) for k in keys}
        out["unavailable_503"] = int(m.get('kvemu_router_requests_total{outcome="unavailable"}', 0))
        st = await self._replica_stats(session)
        out["replica_feed_dropped_batches"] = sum(x["events"]["dropped_batches"] for x in st)
        out["replica_feed_resyncs"] = sum(x["events"]["resyncs"] for x in st)
        if self.redis_url:
            out["shipper_failures"] = sum(x["index_shipper"]["failures"] for x in st)
            out["shipper_lost_batches"] = sum(x["index_shipper"]["lost_batches"] for x in st)
        return out

    def pin(self, layout: dict) -> None:
        """(Re)apply a CPU layout to the running processes and this client (None = any CPU)."""
        def cpus(role):
            return [layout[role]] if layout[role] is not None else ALL_CPUS

        self.ps_router.cpu_affinity(cpus("router"))
        for p in self.ps_replicas:
            p.cpu_affinity(cpus("replicas"))
        for p in self.ps_redis:
            p.cpu_affinity(cpus("redis"))
        os.sched_setaffinity(0, cpus("client"))

    def cpu(self) -> dict[str, float]:
        def t(ps):
            c = ps.cpu_times()
            return c.user + c.system

        ours = {"router": t(self.ps_router), "replicas": sum(t(p) for p in self.ps_replicas),
                "redis": sum(t(p) for p in self.ps_redis), "client": t(psutil.Process())}
        m = psutil.cpu_times()
        busy = m.user + m.nice + m.system + getattr(m, "irq", 0) + getattr(m, "softirq", 0) + getattr(m, "steal", 0)
        # CPU the machine spent on anything but this bench's processes: other tenants, the kernel
        ours["foreign"] = busy - sum(ours.values())  # per-process and system counters tick apart: clamped later
        return ours

    async def router_metrics(self, session: aiohttp.ClientSession) -> dict[str, float]:
        async with session.get(self.url + "/metrics") as r:
            text = await r.text()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            key, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[key] = float(value)
        return out


# The router under cProfile with a CPU-time clock: where its CPU goes, not where it waits
# (a wall clock would charge a socket write with the time the woken receiver ran instead).
PROFILE_SNIPPET = """
import cProfile, runpy, sys, time
out = sys.argv.pop(1)
sys.argv[0:1] = ["kvemu", "router"]
prof = cProfile.Profile(time.process_time)
prof.enable()
try:
    runpy.run_module("kvemu", run_name="__main__", alter_sys=True)
except SystemExit:
    pass
finally:
    prof.disable()
    prof.dump_stats(out)
"""
