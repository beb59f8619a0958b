"""Slow and greedy clients against real processes: heads and bodies have deadlines, connections
a cap, and a port in use is one error line (issue 17, items 5 and 10)."""

import json
import socket
import subprocess
import sys
import time

import pytest

from tests.support.cluster import metric, scrape, start_router, stop_all
from tests.support.procs import REPO, http_json, start_replica

LIMITS = ("--header-timeout", "0.5", "--body-timeout", "0.5", "--write-timeout", "0.5", "--max-connections", "8")


@pytest.fixture(scope="module")
def servers():
    rep = start_replica(*LIMITS, "--capacity-blocks", "8192")  # a 65,536-token output's decode KV fits
    router = start_router([rep.url], *LIMITS)
    yield {"replica": rep, "router": router}
    stop_all(router, rep)


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=5)
    return s


def _closed_after(s: socket.socket, budget: float) -> tuple[float, bytes]:
    """Seconds until the server closed ``s`` and whatever it said before."""
    t0, got = time.monotonic(), b""
    s.settimeout(budget)
    try:
        while chunk := s.recv(4096):
            got += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return time.monotonic() - t0, got


@pytest.mark.parametrize("which", ["replica", "router"])
def test_a_head_sent_byte_by_byte_is_cut_off(servers, which):
    s = _connect(servers[which].url)
    head = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    t0 = time.monotonic()
    for b in head[:20]:  # a byte every 50 ms: well past the 0.5 s deadline for the whole head
        try:
            s.send(bytes([b]))
        except OSError:
            break
        time.sleep(0.05)
    waited, _ = _closed_after(s, 5.0)
    assert time.monotonic() - t0 < 2.0
    s.close()


@pytest.mark.parametrize("which", ["replica", "router"])
def test_a_body_sent_slowly_gets_408_naming_the_body(servers, which):
    s = _connect(servers[which].url)
    s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    waited, got = _closed_after(s, 5.0)
    s.close()
    assert waited < 2.0
    status_line, _, rest = got.partition(b"\r\n")
    assert status_line == b"HTTP/1.1 408 Request Timeout"
    body = json.loads(rest.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["param"] == "body" and body["error"]["code"] == 408


@pytest.mark.parametrize("which", ["replica", "router"])
def test_a_client_that_stops_reading_streams_is_cut_off_and_nothing_else_waits(servers, which):
    url = servers[which].url
    host, port = url.removeprefix("http://").split(":")
    name = "kvemu_router_connections_cut_total" if which == "router" else "kvemu_connections_cut_total"
    cut_before = metric(scrape(url), name, reason="write_timeout")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window, so the server's buffers fill
    s.connect((host, int(port)))
    body = json.dumps({"prompt": "tell me everything", "max_tokens": 65536, "stream": True}).encode()
    # 16 streams of 400 KB pipelined on one connection: 6.4 MB, more than loopback's socket buffers hold.
    s.sendall(16 * (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(body), body)))
    t0 = time.monotonic()
    # Read nothing until the server counts this connection cut (the write deadline is 0.5 s from when
    # its buffers filled; how long they take to fill depends on how busy the machine is) ...
    while metric(scrape(url), name, reason="write_timeout") < cut_before + 1:
        assert time.monotonic() - t0 < 30.0, "the server never cut a client that reads nothing"
        status, _ = http_json("GET", url + "/health", timeout=2.0)
        assert status in (200, 503)  # ... while everyone else is answered
        time.sleep(0.25)
    waited, got = _closed_after(s, 10.0)  # then read what was buffered, up to the cut
    s.close()
    assert got.startswith(b"HTTP/1.1 200") and b"data: " in got
    assert got.count(b"data: [DONE]") < 16  # cut off (with --write-timeout 1000 all 16 arrive, 6.4 MB)
    assert waited < 5.0  # closed, not left open


@pytest.mark.parametrize("which", ["replica", "router"])
def test_connections_beyond_the_cap_get_503_and_the_server_still_answers(servers, which):
    url = servers[which].url
    held = [_connect(url) for _ in range(8)]
    time.sleep(0.1)
    extra = _connect(url)
    _, got = _closed_after(extra, 2.0)
    assert got.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert json.loads(got.split(b"\r\n\r\n", 1)[1])["error"]["code"] == 503
    for s in held:
        s.close()
    time.sleep(0.2)
    status, body = http_json("GET", url + "/health")
    assert status in (200, 503) and "status" in body  # the router's /health is 503 only without replicas


@pytest.mark.parametrize("which", ["replica", "router"])
def test_idle_keepalive_connection_is_not_cut_by_the_head_deadline(servers, which):
    s = _connect(servers[which].url)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.2)
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    time.sleep(1.0)  # idle for twice the head deadline: still open
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    s.close()


@pytest.mark.parametrize("module, extra", [("replica", ["--capacity-blocks", "10"]),
                                           ("router", ["--replicas", "http://127.0.0.1:9"])])
def test_port_in_use_is_one_error_line(module, extra):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([sys.executable, "-m", module, "--port", str(port), *extra], cwd=REPO,
                             capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (f"error: port {port} on 127.0.0.1 is in use; pick another with"
                                                   " --port, or stop what listens there")
    assert "Traceback" not in out.stderr
