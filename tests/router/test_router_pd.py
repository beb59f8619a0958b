"""The router's P/D path (router/pd.py) against real replicas on loopback: roles learned from the replicas'
/health when the command line names none, the prefix decider keeping a prompt the decoder holds local,
a dead prefill instance falling back to a local prefill (counted), a colocated replica beside the pools
prefilling its own requests, and nothing pinned afterwards."""

from __future__ import annotations

import pytest

from tests.support.cluster import start_router, stop_all, wait_for
from tests.support.procs import cluster_auth, http, http_json, start_replica

pytestmark = pytest.mark.slow


def paths(router) -> dict:
    return http_json("GET", router.url + "/cluster")[1]["pd"]["paths"]


def generate(router, tokens: list[int], session: str) -> tuple[dict, dict]:
    status, headers, raw = http("POST", router.url + "/generate", {"token_ids": tokens, "max_tokens": 2},
                                headers={"X-Session-Id": session})
    assert status == 200, raw
    import json

    return json.loads(raw), headers


def unpinned(*reps) -> None:
    def quiet():
        every = [http_json("GET", r.url + "/stats", headers=cluster_auth())[1] for r in reps]
        return all(st["pinned_blocks"] == 0 and st["pd"]["held_requests"] == 0 for st in every)

    wait_for(quiet, timeout=10.0, what="nothing pinned or held")


def test_roles_from_health_the_prefix_decider_and_a_dead_prefill_instance():
    prefill = start_replica("--role", "prefill", replica_id="prefill-0")
    decode = start_replica("--role", "decode", replica_id="decode-0")
    router = None
    try:
        # no role=URL: the router learns each role from /health
        router = start_router([prefill.url, decode.url], "--pd-decider", "prefix", "--pd-threshold-tokens", "64")
        wait_for(lambda: http_json("GET", router.url + "/cluster")[1].get("pd"), timeout=5.0, what="the P/D pools")
        cluster = http_json("GET", router.url + "/cluster")[1]
        assert cluster["pd"]["pools"] == {"prefill": ["prefill-0"], "decode": ["decode-0"], "both": []}
        assert cluster["pd"]["decider"] == "prefix"

        tokens = list(range(320))  # 20 blocks: the decoder lacks all of them, 320 > 64: remote
        first, headers = generate(router, tokens, "a")
        assert headers["X-Kvemu-Pd"] == "remote" and first["pd"]["prefill_replica_id"] == "prefill-0"
        # the decoder now holds the prompt (the KV it received): it lacks 16 + 32 tokens, not over 64: local
        # (once the router's index has the decoder's blocks: until then a try goes remote, and is counted)
        tries: list[str] = []
        wait_for(lambda: tries.append(generate(router, tokens + list(range(1000, 1032)), "a")[1]["X-Kvemu-Pd"])
                 or tries[-1] == "local", timeout=5.0, what="a local decision once the index has the decoder's blocks")
        assert paths(router)["remote"] == 1 + tries.count("remote") and paths(router)["local"] >= 1

        unpinned(prefill, decode)
        prefill.stop()  # a dead prefill instance: the decoder prefills its requests itself
        out, headers = generate(router, list(range(5000, 5400)), "b")
        assert headers["X-Kvemu-Pd"] == "fallback" and out["output_tokens"] == 2 and "pd" not in out
        assert paths(router)["fallback"] == 1
        unpinned(decode)
    finally:
        stop_all(router, prefill, decode)


def test_a_colocated_replica_beside_the_pools_prefills_its_own_requests():
    prefill = start_replica("--role", "prefill", replica_id="prefill-0")
    decode = start_replica("--role", "decode", replica_id="decode-0")
    both = start_replica(replica_id="replica-0")
    router = None
    try:
        router = start_router([f"prefill={prefill.url}", f"decode={decode.url}", both.url], "--pd-decider", "always",
                              routing="round_robin")
        seen = {}
        for i in range(4):
            _, headers = generate(router, list(range(i * 1000, i * 1000 + 200)), f"s{i}")
            seen[headers["X-Kvemu-Replica"]] = headers["X-Kvemu-Pd"]
        assert seen == {"decode-0": "remote", "replica-0": "colocated"}  # never the prefill instance
        counts = paths(router)
        assert counts["remote"] == 2 and counts["colocated"] == 2
        unpinned(prefill, decode)
    finally:
        stop_all(router, prefill, decode, both)
