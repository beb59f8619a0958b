"""A third-party P/D driver against kvemu replicas: the real ``sglang-router --pd-disaggregation`` in front
of one prefill and two decode replicas (replica/sglang_pd.py maps SGLang's bootstrap fields onto the
replicas' legs), driven by the official ``openai`` SDK: every request crosses the link once, the
decoders answer, and nothing stays pinned or held afterwards."""

from __future__ import annotations

import contextlib
import tempfile

import pytest

from tests.conftest import free_port
from tests.support.cluster import wait_for
from tests.support.procs import Proc, cluster_auth, http_json
from tests.support.sglang_router import SglangRouter

pytestmark = pytest.mark.slow
MODEL = "qwen3-coder-30b-a3b"


def _replica(stack: contextlib.ExitStack, replica_id: str, role: str, *extra: str) -> Proc:
    port = free_port()
    proc = Proc(["-m", "kvemu", "replica", "--port", str(port), "--capacity-blocks", "3000", "--time-scale", "0",
                 "--replica-id", replica_id, "--role", role, *extra], port)
    stack.callback(proc.stop, timeout=10.0)
    proc.wait_healthy()
    return proc


def pd_router(prefill: list[Proc], decode: list[Proc], log_dir: str) -> SglangRouter:
    """sglang-router's P/D mode: each prefill replica's bootstrap port is its own HTTP port (kvemu runs no
    separate bootstrap server)."""
    return SglangRouter(["--pd-disaggregation", *[x for p in prefill for x in ("--prefill", p.url, str(p.port))],
                         *[x for d in decode for x in ("--decode", d.url)], "--policy", "round_robin"], log_dir)


@pytest.fixture(scope="module")
def sglang_pd():
    pytest.importorskip("sglang_router", reason="the dev extra installs sglang-router")
    with tempfile.TemporaryDirectory(prefix="kvemu-sglang-pd-") as log_dir, contextlib.ExitStack() as stack:
        prefill = [_replica(stack, "prefill-0", "prefill")]
        # a decode replica asks a bootstrap (with the cluster token) only of the prefill replicas it was given
        peers = ",".join(f"127.0.0.1:{p.port}" for p in prefill)
        decode = [_replica(stack, f"decode-{i}", "decode", "--pd-peers", peers) for i in range(2)]
        router = pd_router(prefill, decode, log_dir)
        stack.callback(router.stop)
        workers = router.wait_workers(3)
        yield router, prefill, decode, workers


def stats(url: str) -> dict:
    return http_json("GET", url + "/stats", headers=cluster_auth())[1]


def test_sglang_router_pd_mode_drives_kvemu_replicas(sglang_pd):
    from openai import OpenAI

    router, prefill, decode, workers = sglang_pd
    kinds = sorted((w["worker_type"], w.get("bootstrap_port")) for w in workers)
    assert kinds == [("decode", None), ("decode", None), ("prefill", prefill[0].port)]
    client = OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    system = "You review pull requests carefully and explain each problem. " * 20
    served = []
    for turn in range(4):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": f"Review change {turn}."}]
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, max_tokens=6)
        reply = raw.parse()
        served.append(raw.headers["x-kvemu-replica"])
        assert reply.usage is not None and reply.usage.completion_tokens == 6 and reply.choices[0].message.content
    chunks = list(client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "stream " * 50}],
                                                 max_tokens=4, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.usage.completion_tokens for c in chunks if c.usage is not None] == [4]
    completion = client.completions.create(model=MODEL, prompt="word " * 200, max_tokens=3)
    assert completion.usage.completion_tokens == 3
    assert set(served) == {"decode-0", "decode-1"}  # round robin over the decode pool; the answers are theirs

    requests = 6

    def settled():
        p = stats(prefill[0].url)
        ds = [stats(d.url) for d in decode]
        quiet = all(st["pinned_blocks"] == 0 for st in (p, *ds)) and p["pd"]["held_requests"] == 0
        return (p, ds) if quiet and all(d["pd"]["waiting_for_kv"] == 0 for d in ds) else None

    p, ds = wait_for(settled, timeout=10.0, what="nothing pinned or held on any replica")
    assert p["pd"]["send"]["transfers"] == requests and p["pd"]["send"]["bytes"] > 0
    assert sum(d["pd"]["recv"]["transfers"] for d in ds) == requests
    assert sum(d["pd"]["remote_requests"] for d in ds) == requests
    assert all(sum(d["pd"]["failovers"].values()) == 0 for d in ds)
    assert p["pd"]["held_total"] == requests and p["pd"]["pulls_unknown"] == 0


def test_a_decode_leg_without_a_reachable_bootstrap_server_is_a_400(sglang_pd):
    _, _, decode, _ = sglang_pd
    body = {"prompt": "hello there", "max_tokens": 2, "bootstrap_room": 7}
    status, out = http_json("POST", decode[0].url + "/v1/completions", body)
    assert status == 400 and out["error"]["param"] == "bootstrap_port", out
    dead = free_port()  # not one of its --pd-peers: refused before any connection
    status, out = http_json("POST", decode[0].url + "/v1/completions",
                            {**body, "bootstrap_host": "127.0.0.1", "bootstrap_port": dead})
    assert status == 400 and out["error"]["param"] == "bootstrap_host" and f"127.0.0.1:{dead}" in out["error"]["message"]
    status, out = http_json("POST", decode[0].url + "/v1/completions", {**body, "bootstrap_room": "seven"})
    assert status == 400 and out["error"]["param"] == "bootstrap_room"
    assert stats(decode[0].url)["pinned_blocks"] == 0
