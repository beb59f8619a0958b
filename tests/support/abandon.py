"""Clients that go away: a request sent on a raw socket the test closes when it likes, and what a
replica counts of its requests (running, waiting, aborted, succeeded, blocks held)."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

from tests.support.cluster import metric, scrape, wait_for
from tests.support.procs import http_json


class Abandoned:
    """``POST path`` with a JSON body on its own connection; ``close()`` is the client leaving."""

    def __init__(self, url: str, path: str, body: dict, headers: dict | None = None) -> None:
        parts = urlsplit(url)
        data = json.dumps(body).encode()
        head = [f"POST {path} HTTP/1.1", f"Host: {parts.netloc}", "Content-Type: application/json",
                f"Content-Length: {len(data)}", *(f"{k}: {v}" for k, v in (headers or {}).items())]
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=10.0)
        self.sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + data)
        self.received = b""

    def read_until(self, marker: bytes, timeout: float = 10.0) -> bytes:
        """Read until ``marker`` has come (a streamed response's first data chunk)."""
        deadline = time.monotonic() + timeout
        while marker not in self.received:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError(f"connection closed before {marker!r}: {self.received[-300:]!r}")
            self.received += chunk
        return self.received

    def close(self) -> None:
        self.sock.close()


def counts(replica_url: str) -> dict:
    """What a replica shows of its requests: the /metrics series and the /stats fields."""
    m = scrape(replica_url)
    st = http_json("GET", replica_url + "/stats", timeout=5.0)[1]
    return {"running": metric(m, "vllm:num_requests_running"), "waiting": metric(m, "vllm:num_requests_waiting"),
            "aborted": metric(m, "kvemu_requests_aborted_total"), "success": metric(m, "vllm:request_success_total"),
            "stats_aborted": st["scheduler"]["aborted"], "stats_finished": st["scheduler"]["finished"],
            "pinned_blocks": st["pinned_blocks"], "private_blocks": st["private_blocks"]}


def wait_running(replica_url: str, running: int, waiting: int = 0, timeout: float = 10.0) -> dict:
    return wait_for(lambda: (c := counts(replica_url))["running"] == running and c["waiting"] == waiting and c,
                    timeout=timeout, interval=0.02, what=f"{running} running and {waiting} waiting")


def assert_aborted(replica_url: str, before: dict, aborted: int = 1, timeout: float = 2.0) -> dict:
    """Within ``timeout`` of the client leaving: nothing runs or waits, ``aborted`` more requests
    aborted, none more succeeded, and no block is held."""
    after = wait_running(replica_url, 0, timeout=timeout)
    assert after["aborted"] == after["stats_aborted"] == before["aborted"] + aborted, (before, after)
    assert after["success"] == before["success"] and after["stats_finished"] == before["stats_finished"]
    assert after["pinned_blocks"] == 0 and after["private_blocks"] == 0, after
    return after
