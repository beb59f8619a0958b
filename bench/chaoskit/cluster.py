"""Real kvemu processes on 127.0.0.1 for the chaos bench: replicas, a router (optionally
several workers under a supervisor), a private redis-server; kill, restart, measure RSS."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get_json(url: str, timeout: float = 2.0) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return json.loads(err.read())


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    text = fh.read()
            except OSError:
                continue
            if int(text[text.rindex(")") + 2:].split()[1]) == pid:
                out.append(int(entry))
    return out


class Redis:
    def __init__(self, workdir: str) -> None:
        self.port = free_port()
        self.dir = workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("redis-server is not on PATH")
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.dir], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class Cluster:
    """``replicas`` replicas behind one router; ``index`` is "memory" or "redis"."""

    def __init__(self, replicas: int = 3, index: str = "memory", workers: int = 1, time_scale: float = 0.05,
                 replica_args: tuple = (), router_args: tuple = ()) -> None:
        self.dir = tempfile.mkdtemp(prefix="kvemu-chaos-")
        self.index = index
        self.redis = Redis(self.dir) if index == "redis" else None
        self.cluster = "chaos" + str(os.getpid())
        self.time_scale, self.replica_args, self.router_args, self.workers = time_scale, replica_args, router_args, workers
        self.ports = [free_port() for _ in range(replicas)]
        self.replicas: list[subprocess.Popen | None] = [None] * replicas
        self.router: subprocess.Popen | None = None
        self.router_port = free_port()
        self.env = {**os.environ, "KVEMU_CLUSTER_TOKEN": "chaos-" + os.urandom(8).hex()}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    def replica_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.ports[i]}"

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(os.path.join(self.dir, f"{name}.log"), "ab")
        return subprocess.Popen([sys.executable, *args], cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)

    def start_replica(self, i: int) -> None:
        args = ["-m", "kvemu", "replica", "--port", str(self.ports[i]), "--replica-id", f"c{i}", "--capacity-blocks", "4000",
                "--time-scale", str(self.time_scale), *self.replica_args]
        if self.redis:
            args += ["--index", self.redis.url, "--cluster", self.cluster]
        self.replicas[i] = self._spawn(f"replica-{i}", args)
        self.wait(lambda: get_json(self.replica_url(i) + "/health").get("status") == "ok", f"replica {i}")

    def start(self) -> Cluster:
        if self.redis:
            self.redis.start()
        for i in range(len(self.ports)):
            self.start_replica(i)
        args = ["-m", "kvemu", "router", "--port", str(self.router_port), "--replicas",
                ",".join(self.replica_url(i) for i in range(len(self.ports))), "--health-interval", "0.5",
                "--index", self.redis.url if self.redis else "memory", "--cluster", self.cluster,
                "--workers", str(self.workers), *self.router_args]
        self.router = self._spawn("router", args)
        # start-up beside the other test worker can be slow (it missed 30 s once in CI's layout)
        self.wait(lambda: self.healthy() == len(self.ports), "router sees every replica", timeout=90.0)
        return self

    def healthy(self) -> int:
        try:
            return int(get_json(self.url + "/health", timeout=1.0).get("healthy_replicas", 0))
        except (OSError, ValueError):
            return -1

    def wait(self, pred, what: str, timeout: float = 30.0) -> float:
        took = wait_until(pred, timeout, every=0.02)
        if took is None:
            raise RuntimeError(f"{what}: not within {timeout} s (logs in {self.dir})")
        return took

    def kill_replica(self, i: int) -> None:
        proc = self.replicas[i]
        assert proc is not None, f"replica {i} was never started"
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def router_workers(self) -> list[int]:
        assert self.router is not None, "start() starts the router"
        return children(self.router.pid) if self.workers > 1 else [self.router.pid]

    def pids(self) -> dict[str, int]:
        out = {f"replica-{i}": p.pid for i, p in enumerate(self.replicas) if p and p.poll() is None}
        for k, pid in enumerate(self.router_workers()):
            out[f"router-{k}"] = pid
        if self.redis and self.redis.proc:
            out["redis"] = self.redis.proc.pid
        return out

    def rss(self) -> dict[str, float]:
        return {name: round(v, 1) for name, pid in self.pids().items() if (v := rss_mb(pid)) is not None}

    def stop(self) -> None:
        procs = [self.router, *self.replicas]
        for p in procs:
            if p and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            if p:
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if self.redis:
            self.redis.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_until(pred, timeout: float, every: float = 0.1) -> float | None:
    """Seconds until ``pred()`` held, None if it did not within ``timeout``."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if pred():
                return time.monotonic() - t0
        except (OSError, ValueError):
            pass
        time.sleep(every)
    return None
