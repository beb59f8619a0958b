"""Issue 17, item 6: internal endpoints need the cluster token; session ids are hashed unless
asked for raw with the token; beyond loopback a token is required."""

import subprocess
import sys

import pytest

from shared.auth import session_label
from tests.support.cluster import start_router, stop_all, wait_for
from tests.support.procs import REPO, Proc, http, http_json

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def guarded():
    from tests.conftest import free_port

    port = free_port()
    rep = Proc(["-m", "replica", "--port", str(port), "--capacity-blocks", "200", "--time-scale", "0",
                "--replica-id", "g0"], port, env={"KVEMU_CLUSTER_TOKEN": TOKEN})
    rep.wait_healthy()
    router = start_router([rep.url], "--cluster-token", TOKEN)
    yield rep, router
    stop_all(router, rep)


@pytest.mark.parametrize("method, path", [("GET", "/kv/events?after=0"), ("POST", "/kv/resync")])
def test_internal_endpoints_need_the_token(guarded, method, path):
    rep, _ = guarded
    status, headers, data = http(method, rep.url + path)
    assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
    assert http(method, rep.url + path, headers={"Authorization": "Bearer wrong"})[0] == 401
    assert http(method, rep.url + path, headers=AUTH)[0] == 200


def test_router_with_the_token_feeds_its_index_and_hashes_sessions(guarded):
    rep, router = guarded
    body = {"token_ids": list(range(64)), "max_tokens": 1}
    assert http("POST", router.url + "/generate", body, headers={"X-Session-Id": "alice@example.com"})[0] == 200
    wait_for(lambda: http_json("GET", rep.url + "/kv/events?after=0", headers=AUTH)[1]["next_seq"] > 1)
    status, stats = http_json("GET", rep.url + "/stats")
    assert status == 200
    assert stats["top_sessions"] == [{"session": session_label("alice@example.com", TOKEN), "blocks": 4}]
    assert "alice" not in str(stats)
    assert http("GET", rep.url + "/stats?sessions=raw")[0] == 401
    raw = http_json("GET", rep.url + "/stats?sessions=raw", headers=AUTH)[1]
    assert raw["top_sessions"] == [{"session": "alice@example.com", "blocks": 4}]
    view = http_json("GET", router.url + "/cluster")[1]
    assert view["replicas"][0]["top_sessions"] == [{"session": session_label("alice@example.com", TOKEN),
                                                    "blocks": 4}]
    raw_view = http_json("GET", router.url + "/cluster?sessions=raw", headers=AUTH)[1]
    assert raw_view["replicas"][0]["top_sessions"] == [{"session": "alice@example.com", "blocks": 4}]


def test_session_labels_are_keyed_and_stable():
    assert session_label("a", "k1") == session_label("a", "k1") != session_label("a", "k2")
    assert session_label(None, "k1") is None and session_label("a", None).startswith("s-")


@pytest.mark.parametrize("module, extra", [("replica", ["--capacity-blocks", "10"]),
                                           ("router", ["--replicas", "http://127.0.0.1:9"])])
def test_binding_beyond_loopback_needs_a_token(module, extra):
    out = subprocess.run([sys.executable, "-m", module, "--host", "0.0.0.0", "--port", "0", *extra], cwd=REPO,
                         capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith(
        "error: cluster_token: required to bind 0.0.0.0 (beyond loopback)")
