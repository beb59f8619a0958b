"""``kvemu router --workers N``: N router processes behind one listening socket, restarted when
one dies.

The supervisor binds the port once (``SO_REUSEPORT`` on, so more supervisors or single
routers can join the same port) and hands the socket to each worker; every worker accepts
from the same queue, so a worker killed with ``kill -9`` loses only the requests it was
serving: connections still waiting to be accepted go to the others. Each worker is a full
router with its own embedded index fed from the replicas' event feeds (or the shared
Redis index), so no state has to survive a worker. Their metrics are one set for the whole router
(prometheus_client's multiprocess mode, in a directory the supervisor makes: router/metrics.py). The supervisor restarts a dead worker
(waiting longer each time one dies young) and stops them all on SIGTERM / SIGINT.
"""

from __future__ import annotations

import ctypes
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from prometheus_client import multiprocess

from router.metrics import MULTIPROC_ENV
from shared.http_server import bind

log = logging.getLogger("kvemu.router.workers")
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:  # not Linux: the supervisor's signal handler still stops its workers
        pass


def worker_argv(argv: list[str], fd: int) -> list[str]:
    """A worker's command line: the router's arguments (without ``--workers``) and the inherited socket."""
    return [sys.executable, "-m", "kvemu", "router", *argv, "--listen-fd", str(fd)]


class Supervisor:
    def __init__(self, argv: list[str], host: str, port: int, workers: int) -> None:
        self.sock = bind(host, port, reuse_port=True)
        self.sock.set_inheritable(True)
        self.argv = worker_argv(argv, self.sock.fileno())
        # The workers' metrics, one set for the whole router: prometheus_client's multiprocess files
        # (router/metrics.py), in a directory only this user can read, removed when the router stops.
        self.metrics_dir = tempfile.mkdtemp(prefix="kvemu-router-metrics-")
        self.env = {**os.environ, MULTIPROC_ENV: self.metrics_dir, "KVEMU_ROUTER_WORKERS": str(workers)}
        self.procs: list[subprocess.Popen | None] = [None] * workers
        self.started_at = [0.0] * workers
        self.backoff = [0.2] * workers
        self.restarts = 0
        self.stopping = False

    def spawn(self, i: int) -> None:
        self.procs[i] = subprocess.Popen(self.argv, pass_fds=(self.sock.fileno(),), preexec_fn=_die_with_parent,
                                         stdin=subprocess.DEVNULL, env=self.env)
        self.started_at[i] = time.monotonic()

    def run(self) -> int:
        def on_signal(signum, frame):
            self.stopping = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        for i in range(len(self.procs)):
            self.spawn(i)
        next_try = [0.0] * len(self.procs)
        while not self.stopping:
            now = time.monotonic()
            for i, p in enumerate(self.procs):
                if p is not None and p.poll() is not None:
                    young = now - self.started_at[i] < 5.0
                    self.backoff[i] = min(self.backoff[i] * 2, 5.0) if young else 0.2
                    print(f"router worker {i} (pid {p.pid}) exited with {p.returncode}; restarting in "
                          f"{self.backoff[i]:.1f} s", file=sys.stderr, flush=True)
                    self.procs[i], next_try[i] = None, now + self.backoff[i]
                    # its counters stay (they only go up); its live gauges (in flight, ...) go
                    multiprocess.mark_process_dead(p.pid, self.metrics_dir)
                if self.procs[i] is None and now >= next_try[i]:
                    self.spawn(i)
                    self.restarts += 1
            time.sleep(0.05)
        return self.stop()

    def stop(self, grace: float = 30.0) -> int:
        alive = [p for p in self.procs if p is not None and p.poll() is None]
        for p in alive:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in alive:
            try:
                p.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.sock.close()
        shutil.rmtree(self.metrics_dir, ignore_errors=True)
        return 0


def supervise(argv: list[str], host: str, port: int, workers: int) -> int:
    print(f"router supervisor (pid {os.getpid()}): {workers} workers on http://{host}:{port}",
          file=sys.stderr, flush=True)
    return Supervisor(argv, host, port, workers).run()
