"""`kvemu` subcommands as real subprocesses, and the /proc bookkeeping that proves no child
outlives them: the PIDs a command started are recorded while it runs, then checked after."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def kvemu_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvemu", *args]


def run_kvemu(*args: str, timeout: float = 60.0, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(kvemu_cmd(*args), cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env=env)


# ---- /proc ------------------------------------------------------------------------------
def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, ppid) of a live process, None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            text = fh.read()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()  # the command name may hold spaces and parentheses
    return rest[0], int(rest[1])


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def children_of(pid: int) -> dict[int, str]:
    """Direct children of ``pid``: {child pid: command line}."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st is not None and st[1] == pid:
                out[int(entry)] = cmdline(int(entry))
    return out


def alive(pid: int, cmd: str) -> bool:
    """Still running (a zombie counts as dead) and still the same program (no PID reuse)."""
    st = _stat(pid)
    return st is not None and st[0] not in ("Z", "X") and cmdline(pid) == cmd


def wait_dead(procs: dict[int, str], timeout: float) -> dict[int, str]:
    """The subset of ``procs`` still alive after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = {p: c for p, c in procs.items() if alive(p, c)}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def kill_all(procs: dict[int, str]) -> None:
    """Last-resort cleanup of recorded PIDs (never by name)."""
    for pid, cmd in procs.items():
        if alive(pid, cmd):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


class ChildWatcher:
    """Records every direct child of ``pid`` while it runs (a thread polling /proc)."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid, self.interval = pid, interval
        self.seen: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        parent = cmdline(self.pid)
        while not self._stop.is_set():
            for pid, cmd in children_of(self.pid).items():
                if cmd and cmd != parent:  # skip a child caught between fork and exec, or exiting
                    self.seen[pid] = cmd
            self._stop.wait(self.interval)

    def stop(self) -> dict[int, str]:
        self._stop.set()
        self._thread.join()
        return self.seen


# ---- kvemu up ---------------------------------------------------------------------------
class Up:
    """``kvemu up ARGS`` in the background; ``ready()`` parses the URLs it prints."""

    def __init__(self, *args: str, env: dict | None = None) -> None:
        self.stderr_file = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(kvemu_cmd("up", *args), cwd=REPO, env=env, stdout=subprocess.PIPE,
                                     stderr=self.stderr_file, stdin=subprocess.DEVNULL, text=True)
        self.lines: queue.Queue = queue.Queue()
        self.stdout: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.urls: dict[str, str] = {}
        self.children: dict[int, str] = {}

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def ready(self, timeout: float = 60.0) -> dict[str, str]:
        """{"router": url, "replica-0": url, ..., ["redis": url]} once it says 'press Ctrl-C'."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(f"kvemu up not ready in {timeout}s; stdout={self.stdout} "
                                     f"stderr={self.stderr()}") from None
            if line is None:
                raise AssertionError(f"kvemu up exited {self.proc.wait()}: stdout={self.stdout} "
                                     f"stderr={self.stderr()}")
            self.stdout.append(line)
            if line.startswith("press Ctrl-C"):
                break
            name, _, value = line.strip().partition(" ")
            self.urls[name] = value.strip()
        self.children = children_of(self.proc.pid)
        return self.urls

    def stderr(self) -> str:
        self.stderr_file.seek(0)
        return self.stderr_file.read()

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        return self.proc.wait(timeout)

    def cleanup(self) -> None:
        """Whatever a failed test left: the command, then every child it was seen with."""
        if self.proc.poll() is None:
            self.children.update(children_of(self.proc.pid))
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        kill_all(self.children)
        self.stderr_file.close()
