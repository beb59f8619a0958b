"""The real sglang-router (``python -m sglang_router.launch_router``) on loopback in front of kvemu
replicas: its metrics too, in its own process group, logging to a file shown when something fails."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import free_port
from tests.support.procs import http_json


class SglangRouter:
    def __init__(self, workers_and_policy: list[str], log_dir: str) -> None:
        """``workers_and_policy``: ``--worker-urls ...`` or ``--pd-disaggregation ...``, then ``--policy``;
        the address, metrics, health checks and logging are every test's."""
        self.port, self.metrics_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.log_path = Path(log_dir) / "router.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_router.launch_router", *workers_and_policy,
             "--host", "127.0.0.1", "--port", str(self.port),
             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(self.metrics_port),
             "--health-check-interval-secs", "2", "--shutdown-grace-period-secs", "1", "--log-level", "info"],
            cwd=log_dir, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "NO_COLOR": "1"})

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def wait_workers(self, n: int, model: str | None = None, timeout: float = 30.0) -> list[dict]:
        """The router's ``/workers`` once it lists ``n``, every one healthy (and serving ``model`` if given)."""
        deadline = time.monotonic() + timeout
        last: object = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"sglang-router exited {self.proc.returncode}:\n{self.tail()}")
            try:
                status, body = http_json("GET", self.url + "/workers", timeout=2.0)
            except OSError as exc:
                last = exc
            else:
                last = body
                workers = body.get("workers", []) if status == 200 and isinstance(body, dict) else []
                if len(workers) == n and all(w["is_healthy"] and model in (None, w["model_id"]) for w in workers):
                    return workers
            time.sleep(0.1)
        serving = f" serving {model}" if model else ""
        raise AssertionError(f"{n} healthy workers{serving} not registered in {timeout}s (last: {last!r})\n{self.tail()}")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.close()
