"""Real processes on loopback for integration tests: start, wait for /health, stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[2]


def http(method: str, url: str, body=None, headers=None, timeout: float = 30.0, raw: bytes | None = None):
    """(status, headers, body bytes) without raising on 4xx/5xx."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    hdrs = {"Content-Type": "application/json"} if body is not None else {}
    hdrs.update(headers or {})
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def cluster_auth() -> dict[str, str]:
    """The header that opens the internal endpoints (/kv/*) of processes this test run started
    without a token: the one they share through the runtime directory (tests/conftest.py gives the
    run its own KVEMU_RUNTIME_DIR)."""
    from shared.runtime_dir import cluster_token_path, read_token_file

    return {"Authorization": f"Bearer {read_token_file(cluster_token_path())}"}


def http_json(method: str, url: str, body=None, headers=None, timeout: float = 30.0):
    status, _, data = http(method, url, body, headers, timeout)
    return status, json.loads(data) if data else None


class Proc:
    def __init__(self, args: list[str], port: int, env: dict | None = None):
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.args = args
        self.log = open(os.devnull, "w")
        self.proc = subprocess.Popen([sys.executable, *args], cwd=REPO, env={**os.environ, **(env or {})},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def wait_healthy(self, timeout: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                out, err = self.proc.communicate()
                raise RuntimeError(f"process exited {self.proc.returncode}: {err.decode()[-2000:]}")
            try:
                status, body = http_json("GET", self.url + "/health", timeout=1.0)
                if status == 200:
                    return body
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{self.args} did not become healthy")

    def stop(self, sig=signal.SIGTERM, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_replica(*extra: str, capacity_blocks: int = 2000, time_scale: float = 0.0, port: int | None = None,
                  replica_id: str | None = None) -> Proc:
    port = port or free_port()
    args = ["-m", "kvemu", "replica", "--port", str(port), "--capacity-blocks", str(capacity_blocks),
            "--time-scale", str(time_scale)]
    if replica_id:
        args += ["--replica-id", replica_id]
    proc = Proc(args + list(extra), port, env={"KVEMU_ADMIN_TOKEN": "secret"})  # not on its command line
    proc.wait_healthy()
    return proc


class Listener:
    """A plain TCP listener on loopback that records what every connection sends (the first 64 KiB) and
    answers HTTP 200 ``{}``: where a request would have a process send something to an address it chose."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            with conn:
                conn.settimeout(2.0)
                data = b""
                try:
                    while b"\r\n\r\n" not in data and len(data) < 65536:
                        chunk = conn.recv(4096)
                        if not chunk:
                            break
                        data += chunk
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                                 b"Connection: close\r\n\r\n{}")
                except OSError:
                    pass
                self.received.append(data)

    def close(self) -> None:
        self.sock.close()


def as_from_a_terminal() -> None:
    """A child's ``preexec_fn``: SIGINT at its default disposition and unblocked, as a shell starts a command,
    whatever the test process inherited or set (an ignored signal stays ignored across exec)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
