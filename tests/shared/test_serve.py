"""Slow and greedy clients against real processes: heads and bodies have deadlines, connections
a cap shared fairly between client addresses, heads and bodies aiohttp or the decoder refuse are
JSON errors naming the header or field, and a port in use is one error line."""

import json
import socket
import subprocess
import sys
import time

import msgpack
import pytest

from tests.support.cluster import metric, scrape, start_router, stop_all
from tests.support.procs import REPO, http, http_json, start_replica

LIMITS = ("--header-timeout", "0.5", "--body-timeout", "0.5", "--write-timeout", "0.5", "--max-connections", "8",
          "--max-connections-per-client", "3")


@pytest.fixture(scope="module")
def servers():
    rep = start_replica(*LIMITS, "--capacity-blocks", "8192")  # a 65,536-token output's decode KV fits
    router = start_router([rep.url], *LIMITS)
    yield {"replica": rep, "router": router}
    stop_all(router, rep)


def _connect(url: str, source: str = "") -> socket.socket:
    """A connection from ``source`` (any 127.0.0.x is this host's loopback: another client address)."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=5, source_address=(source, 0))
    return s


HEALTH = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"


def _idle(url: str, source: str) -> socket.socket:
    """A keep-alive connection that was answered once and now sits idle (no head deadline runs)."""
    s = _connect(url, source)
    s.sendall(HEALTH)
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
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


def _sent_then_closed(url: str, raw: bytes, budget: float = 5.0) -> tuple[float, bytes]:
    """``raw`` sent on a new connection: seconds until the server closed it and what it said before."""
    s = _connect(url)
    s.sendall(raw)
    waited, got = _closed_after(s, budget)
    s.close()
    return waited, got


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
    waited, got = _sent_then_closed(servers[which].url, b"POST /generate HTTP/1.1\r\nHost: x\r\n"
                                    b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
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
        out = subprocess.run([sys.executable, "-m", "kvemu", module, "--port", str(port), *extra], cwd=REPO,
                             capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1] == (f"error: port {port} on 127.0.0.1 is in use; pick another with"
                                                   " --port, or stop what listens there")
    assert "Traceback" not in out.stderr


def _closed_now(s: socket.socket) -> bool:
    s.settimeout(0.05)
    try:
        return s.recv(4096) == b""
    except TimeoutError:
        return False


def _refused(url: str, source: str) -> bool:
    _, got = _closed_after(_connect(url, source), 2.0)
    return got.startswith(b"HTTP/1.1 503 Service Unavailable\r\n") and b"Retry-After: 1" in got


def test_at_the_cap_a_greedy_address_makes_room_for_another(servers):
    """The operator's probe (one address holding the whole cap locked everyone else out) at small
    scale on the router, whose clients are only this test's: cap 8, each address's share 3 (LIMITS)."""
    url = servers["router"].url
    cut = "kvemu_router_connections_cut_total"
    by_client = "kvemu_router_connections_cut_by_client_total"
    before = scrape(url)
    greedy = [_idle(url, "127.0.0.2") for _ in range(8)]  # the whole cap, one address
    assert _refused(url, "127.0.0.2")  # at the cap and over its share: its ninth is refused
    # Another address, a fresh connection per request: all answered. The first found the cap full and
    # took the greedy address's oldest idle connection (8 -> 7 + 1); once it closed, there was room.
    for _ in range(5):
        s = _connect(url, "127.0.0.3")
        s.sendall(HEALTH.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        assert _closed_after(s, 5.0)[1].startswith(b"HTTP/1.1 200")
        s.close()
    # It holds three: the first fits (7 + 1), the next two take one greedy connection each (5 + 3);
    # its fourth, at its share, is refused.
    mine = [_idle(url, "127.0.0.3") for _ in range(3)]
    assert _refused(url, "127.0.0.3")
    assert [_closed_now(s) for s in greedy] == [True] * 3 + [False] * 5  # the oldest idle ones, closed
    for s in greedy[3:] + mine:  # the rest still serve
        s.sendall(HEALTH)
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
    for s in greedy + mine:
        s.close()
    time.sleep(0.2)
    after = scrape(url)
    assert metric(after, cut, reason="over_client_share") - metric(before, cut, reason="over_client_share") == 3
    assert metric(after, cut, reason="over_cap") - metric(before, cut, reason="over_cap") == 2
    assert metric(after, by_client, client="127.0.0.2") - metric(before, by_client, client="127.0.0.2") == 4
    assert metric(after, by_client, client="127.0.0.3") - metric(before, by_client, client="127.0.0.3") == 1


def _post(url: str, path: str, raw: bytes, headers: dict) -> tuple[int, dict]:
    status, _, data = http("POST", url + path, raw=raw, headers=headers)
    return status, json.loads(data)["error"] if status >= 400 else json.loads(data)


@pytest.mark.parametrize("which", ["replica", "router"])
def test_a_non_finite_number_is_a_400_naming_its_field(servers, which):
    url = servers[which].url
    for raw, field in ((b'{"prompt": "hi", "max_tokens": 1, "temperature": NaN}', "temperature"),
                       (b'{"prompt": "hi", "max_tokens": 1, "top_p": Infinity}', "top_p"),
                       (b'{"prompt": "hi", "max_tokens": 1, "seed": -1e400}', "seed")):
        status, err = _post(url, "/v1/completions", raw, {"Content-Type": "application/json"})
        assert (status, err["param"]) == (400, field), err
    raw = msgpack.packb({"token_ids": [1, 2], "temperature": float("nan")})
    status, err = _post(url, "/generate", raw, {"Content-Type": "application/msgpack"})
    assert (status, err["param"], err["message"]) == (400, "temperature", "temperature: is NaN; send a finite number"
                                                                           " (JSON has no NaN or Infinity)")


@pytest.mark.parametrize("which", ["replica", "router"])
def test_a_body_that_is_not_json_or_msgpack_is_a_415_naming_the_header(servers, which):
    url, body = servers[which].url, json.dumps({"token_ids": [1, 2], "max_tokens": 1}).encode()
    status, err = _post(url, "/generate", body, {"Content-Type": "text/plain; charset=utf-8"})
    assert (status, err["param"], err["code"]) == (415, "Content-Type", 415)
    assert err["message"] == ("Content-Type: 'text/plain' bodies are not read; send Content-Type: application/json"
                              " (or application/msgpack)")
    # what real clients send stays read as JSON: curl -d's and urllib's default form type, aiohttp's
    # bytes default, none at all, a charset parameter, and a +json type
    for ctype in ("application/x-www-form-urlencoded", "application/octet-stream", None,
                  "application/json; charset=utf-8", "application/vnd.kvemu+json"):
        status, out = _post(url, "/generate", body, {} if ctype is None else {"Content-Type": ctype})
        assert status == 200 and out["output_tokens"] == 1, (ctype, out)


@pytest.mark.parametrize("which", ["replica", "router"])
def test_a_negative_content_length_is_a_json_400_naming_the_header(servers, which):
    waited, got = _sent_then_closed(servers[which].url, b"POST /generate HTTP/1.1\r\nHost: x\r\n"
                                    b"Content-Type: application/json\r\nContent-Length: -5\r\n\r\n{}")
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 400 Bad Request\r\n") and b"Content-Type: application/json" in head
    err = json.loads(body)["error"]
    assert (err["param"], err["code"], err["type"]) == ("Content-Length", 400, "invalid_request_error")
    assert err["message"].startswith("Content-Length: must be the body's size in bytes, a decimal integer of 0 or more")
    assert waited < 2.0  # answered and closed at once


def test_each_address_share_is_a_quarter_of_the_cap_unless_given():
    from shared.errors import InputError
    from shared.serving import ServingSettings

    assert ServingSettings().conn_limits().max_connections_per_client == 1024  # 4096 / 4
    assert ServingSettings(max_connections=8).conn_limits().max_connections_per_client == 2
    assert ServingSettings(max_connections=3).conn_limits().max_connections_per_client == 1
    assert ServingSettings(max_connections=8, max_connections_per_client=5).conn_limits().max_connections_per_client == 5
    with pytest.raises(InputError, match="max_connections_per_client"):
        ServingSettings(max_connections_per_client=0)
