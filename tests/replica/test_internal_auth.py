"""Issue 17, item 6: internal endpoints need the cluster token; session ids are hashed unless
asked for raw with the token; beyond loopback a token is required. Without one given, processes
on loopback share the one in their runtime directory (shared/runtime_dir.py): never open."""

import json
import os
import stat
import subprocess
import sys

import pytest

from shared.auth import session_label
from tests.conftest import free_port
from tests.support.cluster import metric, scrape, start_router, stop_all, wait_for
from tests.support.procs import REPO, Proc, http, http_json

TOKEN = "t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def guarded():
    from tests.conftest import free_port

    port = free_port()
    rep = Proc(["-m", "kvemu", "replica", "--port", str(port), "--capacity-blocks", "200", "--time-scale", "0",
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
    out = subprocess.run([sys.executable, "-m", "kvemu", module, "--host", "0.0.0.0", "--port", "0", *extra], cwd=REPO,
                         capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith(
        "error: cluster_token: required to bind 0.0.0.0 (beyond loopback)")


# ---- no token given: the shared one in the runtime directory ------------------------------------
def start_line(proc: Proc, prefix: str = "cluster token: ") -> str:
    """The line starting with ``prefix`` a process printed on stderr at start."""
    assert proc.proc.stderr is not None
    while True:
        line = proc.proc.stderr.readline().decode()
        assert line, "no such line before the end of stderr"
        if line.startswith(prefix):
            return line.rstrip("\n")


def no_token_env(runtime_dir) -> dict:
    return {"KVEMU_RUNTIME_DIR": str(runtime_dir), "KVEMU_CLUSTER_TOKEN": ""}


def replica_without_a_token(runtime_dir, replica_id: str = "solo") -> Proc:
    port = free_port()
    return Proc(["-m", "kvemu", "replica", "--port", str(port), "--capacity-blocks", "200", "--time-scale", "0",
                 "--replica-id", replica_id], port, env=no_token_env(runtime_dir))


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    runtime_dir = tmp_path_factory.mktemp("runtime") / "kvemu"
    rep = replica_without_a_token(runtime_dir)
    rep.wait_healthy()
    yield rep, runtime_dir / "cluster-token"
    stop_all(rep)


def test_a_standalone_replica_without_a_token_makes_one_owner_only_and_says_where(standalone):
    rep, path = standalone
    assert start_line(rep) == f"cluster token: {path}"
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700 and stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert len(path.read_text().strip()) == 32


@pytest.mark.parametrize("method, path", [("POST", "/kv/resync"), ("GET", "/kv/events?after=0")])
def test_a_standalone_replica_refuses_its_internal_endpoints_without_the_token_from_the_file(standalone, method,
                                                                                           path):
    rep, token_file = standalone
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "secret"}):
        status, hdrs, data = http(method, rep.url + path, headers=headers)
        assert status == 401 and hdrs["WWW-Authenticate"] == "Bearer", (headers, status)
        message = json.loads(data)["error"]["message"]
        assert "Authorization: Bearer <token>" in message and str(token_file) in message, message
    token = token_file.read_text().strip()
    assert http(method, rep.url + path, headers={"Authorization": f"Bearer {token}"})[0] == 200


def test_a_router_and_a_replica_started_apart_without_tokens_find_each_other(tmp_path):
    """Both started at once on a fresh runtime directory (so both race to make the file): the router's
    embedded index fills from the replica's feed, which only the shared token opens."""
    runtime_dir = tmp_path / "runtime"
    rep = replica_without_a_token(runtime_dir, "apart")
    port = free_port()
    router = Proc(["-m", "kvemu", "router", "--port", str(port), "--replicas", rep.url, "--health-interval", "0.2"], port,
                  env=no_token_env(runtime_dir))
    try:
        rep.wait_healthy()
        router.wait_healthy()
        assert start_line(rep) == start_line(router) == f"cluster token: {runtime_dir / 'cluster-token'}"
        wait_for(lambda: http_json("GET", router.url + "/health")[1]["healthy_replicas"] == 1, timeout=15)
        body = {"token_ids": list(range(64)), "max_tokens": 1}
        assert http("POST", router.url + "/generate", body)[0] == 200
        wait_for(lambda: metric(scrape(router.url), "kvemu_router_events_applied_total") >= 1, timeout=10,
                 what="the replica's events applied to the router's embedded index")
        again = http_json("POST", router.url + "/generate", {"token_ids": list(range(80)), "max_tokens": 1})[1]
        assert again["cached_tokens"] == 64
    finally:
        stop_all(router, rep)


@pytest.mark.parametrize("module, extra", [("replica", ["--capacity-blocks", "10"]),
                                           ("router", ["--replicas", "http://127.0.0.1:9"])])
def test_a_token_file_others_can_read_is_refused_in_one_line(tmp_path, module, extra):
    runtime_dir = tmp_path / "runtime"
    runtime_dir.mkdir(mode=0o700)
    token_file = runtime_dir / "cluster-token"
    token_file.write_text("0123456789abcdef\n")
    os.chmod(token_file, 0o644)
    out = subprocess.run([sys.executable, "-m", "kvemu", module, "--port", str(free_port()), *extra], cwd=REPO,
                         capture_output=True, text=True, timeout=30, env={**os.environ, **no_token_env(runtime_dir)})
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert lines == [f"error: cluster token file {token_file} is open to group or others (mode 0644): chmod 600"
                     f" {token_file} if nobody else can have read it, else remove it (a new token is made), or set"
                     " KVEMU_RUNTIME_DIR"], out.stderr


def test_a_given_token_writes_nothing_and_says_where_it_came_from(tmp_path):
    runtime_dir = tmp_path / "runtime"
    port = free_port()
    rep = Proc(["-m", "kvemu", "replica", "--port", str(port), "--capacity-blocks", "100", "--time-scale", "0"], port,
               env={"KVEMU_RUNTIME_DIR": str(runtime_dir), "KVEMU_CLUSTER_TOKEN": TOKEN})
    try:
        rep.wait_healthy()
        assert start_line(rep) == "cluster token: from KVEMU_CLUSTER_TOKEN"
        assert not runtime_dir.exists()
        assert http("POST", rep.url + "/kv/resync", headers=AUTH)[0] == 200
    finally:
        stop_all(rep)


def test_an_app_built_without_any_token_refuses_its_internal_endpoints():
    """A library caller's settings (no command line, no file): nothing could open /kv/*, so 403 saying how."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from replica.app import make_app
    from replica.settings import ReplicaSettings

    async def go():
        async with TestClient(TestServer(make_app(ReplicaSettings(capacity_blocks=64, time_scale=0.0)))) as c:
            for method, path in (("GET", "/kv/events?after=0"), ("POST", "/kv/resync")):
                r = await c.request(method, path, headers={"Authorization": "Bearer anything"})
                assert r.status == 403
                assert "--cluster-token or KVEMU_CLUSTER_TOKEN" in (await r.json())["error"]["message"]

    asyncio.run(go())
