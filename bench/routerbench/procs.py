"""The bench's child processes: start them with logs on disk, stop them (frozen or not), CPU layouts."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil

from .settings import REPO, log


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Children get SIGTERM if this process dies without cleaning up (Linux only)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Procs:
    """Every process this bench starts; ``stop_all`` ends them, frozen or not."""

    def __init__(self) -> None:
        self.items: list[tuple[str, subprocess.Popen, Path]] = []
        self.logdir = Path(tempfile.mkdtemp(prefix="kvemu-bench-router-"))
        self.killed: list[str] = []  # did not exit within the timeout after SIGTERM

    def start(self, name: str, cmd: list[str], cpu: int | None) -> subprocess.Popen:
        if cpu is not None:
            cmd = ["taskset", "-c", str(cpu), *cmd]
        log = self.logdir / f"{name}.log"
        with open(log, "wb") as fh:
            p = subprocess.Popen(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 preexec_fn=_die_with_parent)
        self.items.append((name, p, log))
        return p

    def log_tail(self, p: subprocess.Popen, n: int = 1500) -> str:
        for _, q, log_path in self.items:
            if q is p:
                with contextlib.suppress(OSError):
                    return log_path.read_text(errors="replace")[-n:]
        return ""

    def stop(self, procs: list[subprocess.Popen], timeout: float = 10.0) -> None:
        frozen = False
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(psutil.Error):
                    frozen |= psutil.Process(p.pid).status() == psutil.STATUS_STOPPED
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)
        if frozen:
            # Let overdue timers fire before SIGTERM: a timeout expiring together with the
            # shutdown's cancel can hang a replica's exit (see the report of this bench).
            time.sleep(0.5)
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.terminate()
        deadline = time.monotonic() + timeout
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
                self.killed.append(self.name_of(p))

    def log_errors(self, procs: list[subprocess.Popen]) -> dict[str, list[str]]:
        """Exception lines in the processes' logs (e.g. a traceback's last line), by process."""
        out = {}
        for p in procs:
            lines = [ln.strip() for ln in self.log_tail(p, 200_000).splitlines()]
            errs = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", ln)]
            if errs:
                out[self.name_of(p)] = sorted(set(e[:200] for e in errs))[:5]
        return out

    def name_of(self, p: subprocess.Popen) -> str:
        return next((name for name, q, _ in self.items if q is p), str(p.pid))

    def stop_all(self, keep_logs: bool = False) -> None:
        # routers and replicas first (a replica flushes to Redis on the way out), Redis last
        self.stop([p for name, p, _ in self.items if name != "redis-server"])
        self.stop([p for name, p, _ in self.items if name == "redis-server"])
        if keep_logs or self.killed:
            log(f"process logs kept in {self.logdir}")
        else:
            shutil.rmtree(self.logdir, ignore_errors=True)


ALL_CPUS = sorted(os.sched_getaffinity(0))


def cpu_layout(pin: str) -> dict[str, int | None]:
    cpus = ALL_CPUS
    if pin == "none" or len(cpus) < 2 or shutil.which("taskset") is None:
        return {"client": None, "replicas": None, "router": None, "redis": None}
    return {"client": cpus[0], "replicas": cpus[0], "router": cpus[1], "redis": cpus[1]}
