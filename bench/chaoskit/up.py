"""``kvemu up`` driven as a user drives it, for the probe scenarios (bench/chaoskit/probe.py): a subprocess
whose printed lines (``router URL``, ``prefill-0 URL``, ``shared-store URL``, ...) say where everything is;
its children found in /proc by the ``--port`` on their command lines (the pid to SIGKILL or SIGSTOP); the
KV blocks the replicas hold for a remote decode, read from their ``/stats`` (and ``/health`` once it says)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from .cluster import REPO, children, free_port, get_json

READY = "press Ctrl-C to stop"


class Up:
    """``kvemu up ARGS`` on a free router port, with its own runtime directory and a cluster token given in
    the environment (``KVEMU_CLUSTER_TOKEN``: the scenarios look for it in what a listener receives)."""

    def __init__(self, *args: str, timeout: float = 120.0) -> None:
        self.dir = tempfile.mkdtemp(prefix="kvemu-probe-")
        os.chmod(self.dir, 0o700)
        self.token = "chaos-" + os.urandom(12).hex()
        self.args = ["--port", str(free_port()), *args]
        self.timeout = timeout
        self.urls: dict[str, str] = {}  # what up printed: router, replica-0, prefill-0, decode-0, shared-store, ...
        self.lines: list[str] = []
        self.proc: subprocess.Popen | None = None
        self._ready = threading.Event()

    def start(self) -> Up:
        env = {**os.environ, "KVEMU_RUNTIME_DIR": self.dir, "KVEMU_CLUSTER_TOKEN": self.token}
        env.pop("KVEMU_ADMIN_TOKEN", None)
        err = open(os.path.join(self.dir, "up.err"), "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "kvemu", "up", *self.args], cwd=REPO, env=env,
                                     stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        if not self._ready.wait(self.timeout) or READY not in self.lines:
            why = f"kvemu up {' '.join(self.args)} did not start: {self.lines[-5:]} {self.err_tail()}"
            self.stop()
            raise RuntimeError(why)
        return self

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:  # drained to the end, so up never blocks on a full pipe
            line = line.strip()
            self.lines.append(line)
            name, _, value = line.partition(" ")
            if value.strip().startswith(("http://", "redis://", "/")):
                self.urls[name] = value.strip()
            if line == READY:
                self._ready.set()
        self._ready.set()

    def err_tail(self) -> str:
        try:
            with open(os.path.join(self.dir, "up.err"), errors="replace") as fh:
                return fh.read()[-600:]
        except OSError:
            return ""

    @property
    def router(self) -> str:
        return self.urls["router"]

    def replicas(self, role: str = "") -> dict[str, str]:
        """Replica id -> URL, those whose id starts with ``role`` (replica, prefill, decode) or every one."""
        ids = [k for k in self.urls if k.startswith(("replica-", "prefill-", "decode-"))]
        return {k: self.urls[k] for k in ids if k.startswith(role)}

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def pid_of(self, url: str) -> int | None:
        """The pid of up's child (or grandchild) serving ``url``: the one whose command line has its --port."""
        if self.proc is None:
            return None
        port = url.rsplit(":", 1)[1]
        todo, seen = [self.proc.pid], []
        while todo:
            pid = todo.pop()
            for child in children(pid):
                seen.append(child)
                todo.append(child)
        for pid in seen:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as fh:
                    argv = fh.read().decode(errors="replace").split("\0")
            except OSError:
                continue
            if any(a == "--port" and b == port for a, b in zip(argv, argv[1:], strict=False)):
                return pid
        return None

    def signal(self, url: str, sig: signal.Signals) -> int | None:
        pid = self.pid_of(url)
        if pid is not None:
            os.kill(pid, sig)
        return pid

    def stop(self) -> int | None:
        """SIGTERM up (it stops its children), SIGKILL after 30 s; its exit status. The runtime directory
        (the token) goes; up keeps its own logs only when it failed (the path on its ``logs`` line)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        return None if self.proc is None else self.proc.returncode


def healthy(url: str, timeout: float = 1.0) -> bool:
    try:
        return get_json(url + "/health", timeout=timeout).get("status") == "ok"
    except (OSError, ValueError):
        return False


def held(up: Up) -> dict:
    """Blocks held for a remote decode on each replica that holds any (prefill and colocated ones):
    ``/stats`` ``pd.held_blocks`` beside its capacity, and ``/health`` ``held_blocks`` where it says."""
    per: dict[str, dict] = {}
    for rid, url in up.replicas().items():
        if rid.startswith("decode-"):
            continue
        try:
            stats = get_json(url + "/stats", timeout=5.0)
            health = get_json(url + "/health", timeout=5.0)
        except (OSError, ValueError) as exc:
            per[rid] = {"error": type(exc).__name__}
            continue
        pd = stats.get("pd") or {}
        per[rid] = {"held_blocks": pd.get("held_blocks"), "held_requests": pd.get("held_requests"),
                    "capacity_blocks": health.get("capacity_blocks"), "health_held_blocks": health.get("held_blocks")}
    # None where a replica did not answer (up stopped them all, say): not a 0 nobody measured
    total = None if any("error" in v for v in per.values()) else sum(v["held_blocks"] or 0 for v in per.values())
    return {"held_blocks": total, "per_replica": per}
