"""The router's P/D path (router/pd_legs.py) against real replicas on loopback: roles learned from the replicas'
/health when the command line names none, the prefix decider keeping a prompt the decoder holds local,
a dead prefill instance falling back to a local prefill (counted), a colocated replica beside the pools
prefilling its own requests, nothing pinned afterwards; and holds bounded by their decode legs: released by
the router when the client leaves or the decode leg fails, and a replica whose pool holds exhaust routed
around, not taken out."""

from __future__ import annotations

import signal

import pytest

from tests.support.cluster import cluster_row, metric, scrape, start_router, stop_all, wait_for
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


def pd_stats(proc) -> dict:
    return http_json("GET", proc.url + "/stats")[1]["pd"]


def releases(router) -> dict:
    return http_json("GET", router.url + "/cluster")[1]["pd"]["releases"]


def test_a_client_that_leaves_a_frozen_decoder_has_its_prefill_hold_released():
    prefill = start_replica("--role", "prefill", replica_id="prefill-0")
    decode = start_replica("--role", "decode", replica_id="decode-0")
    router = None
    try:
        router = start_router([f"prefill={prefill.url}", f"decode={decode.url}"], "--pd-decider", "always",
                              health_interval=60)  # checked once: the frozen decoder stays routable
        decode.proc.send_signal(signal.SIGSTOP)
        try:
            with pytest.raises(OSError):  # TimeoutError: the client gives up on the decode leg and closes
                http("POST", router.url + "/generate", {"token_ids": list(range(320)), "max_tokens": 2}, timeout=1.0)
            wait_for(lambda: pd_stats(prefill)["held_blocks"] == 0, timeout=2.0, what="the hold released")
        finally:
            decode.proc.send_signal(signal.SIGCONT)
        held = pd_stats(prefill)
        assert (held["held_total"], held["released"], held["expired"]) == (1, 1, 0)
        wait_for(lambda: releases(router) == {"released": 1, "not_held": 0, "failed": 0}, timeout=5.0,
                 what="the release counted")
        unpinned(prefill, decode)  # the thawed decoder's pull finds nothing held and its client gone
    finally:
        stop_all(router, prefill, decode)


def test_a_decode_leg_that_fails_has_its_prefill_hold_released_before_the_retry():
    prefill = start_replica("--role", "prefill", replica_id="prefill-0")
    dead = start_replica("--role", "decode", replica_id="decode-0")
    decode = start_replica("--role", "decode", replica_id="decode-1")
    router = None
    try:
        router = start_router([f"prefill={prefill.url}", f"decode={dead.url}", f"decode={decode.url}"],
                              "--pd-decider", "always", routing="round_robin", health_interval=60)
        dead.stop(signal.SIGKILL)  # round robin tries decode-0 first: refused, retried with a new prefill
        _, headers = generate(router, list(range(320)), "a")
        assert headers["X-Kvemu-Replica"] == "decode-1" and headers["X-Kvemu-Pd"] == "remote"
        # the first hold released by the router, the second by decode-1's pull (the router's ask: a no-op)
        wait_for(lambda: releases(router) == {"released": 1, "not_held": 1, "failed": 0}, timeout=5.0,
                 what="both releases counted")
        held = pd_stats(prefill)
        assert (held["held_total"], held["released"], held["held_requests"], held["expired"]) == (2, 1, 0, 0)
        unpinned(prefill, decode)
    finally:
        stop_all(router, prefill, dead, decode)


def pin(proc, holds: int) -> list[str]:
    """``holds`` 10-block prefill legs held on ``proc`` and never pulled (with the cluster token: no share)."""
    return [http_json("POST", proc.url + "/generate", {"token_ids": [90_000 + 1000 * s + i for i in range(160)],
                                                       "kv_transfer_params": {"do_remote_decode": True}},
                      headers=cluster_auth())[1]["kv_transfer_params"]["remote_request_id"] for s in range(holds)]


def test_a_prefill_instance_whose_holds_exhaust_its_pool_is_routed_around_not_taken_out():
    full = start_replica("--role", "prefill", capacity_blocks=100, replica_id="prefill-0")
    other = start_replica("--role", "prefill", replica_id="prefill-1")
    decode = start_replica("--role", "decode", replica_id="decode-0")
    router = None
    try:
        router = start_router([f"prefill={full.url}", f"prefill={other.url}", f"decode={decode.url}"],
                              "--pd-decider", "always", routing="round_robin")
        rids = pin(full, 9)  # 90 of its 100 blocks
        wait_for(lambda: cluster_row(router.url, "prefill-0")["holds"] == "exhausted", timeout=5.0,
                 what="the router reading the exhausted holds")
        for i in range(4):  # round robin would alternate: every prompt goes to the other instance
            _, headers = generate(router, list(range(i * 1000, i * 1000 + 200)), f"s{i}")
            assert headers["X-Kvemu-Prefill-Replica"] == "prefill-1"
        row = cluster_row(router.url, "prefill-0")
        assert row["healthy"] and (row["held_blocks"], row["held_usage"]) == (90, 0.9)
        samples = scrape(router.url)
        assert metric(samples, "kvemu_router_replica_failures_total") == 0
        assert metric(samples, "kvemu_router_holds_exhausted_total") == 1
        assert metric(samples, "kvemu_router_replica_held_usage", replica_id="prefill-0") == 0.9
        for rid in rids:
            assert http_json("POST", full.url + "/kv/release", {"remote_request_id": rid},
                             headers=cluster_auth())[1]["released"] is True
        wait_for(lambda: cluster_row(router.url, "prefill-0")["holds"] == "ok", timeout=5.0, what="the recovery")
        seen = {generate(router, list(range(i * 1000, i * 1000 + 200)), f"t{i}")[1]["X-Kvemu-Prefill-Replica"]
                for i in range(10, 12)}
        assert seen == {"prefill-0", "prefill-1"}
        unpinned(full, other, decode)
    finally:
        stop_all(router, full, other, decode)


def test_a_colocated_replica_whose_holds_exhaust_its_pool_is_routed_around():
    full = start_replica(capacity_blocks=100, replica_id="replica-0")
    other = start_replica(replica_id="replica-1")
    router = None
    try:
        router = start_router([full.url, other.url], routing="round_robin")
        rids = pin(full, 9)  # a third-party proxy's prefill legs on a colocated replica
        wait_for(lambda: cluster_row(router.url, "replica-0")["holds"] == "exhausted", timeout=5.0,
                 what="the router reading the exhausted holds")
        for i in range(3):
            _, headers = generate(router, list(range(i * 1000, i * 1000 + 200)), f"s{i}")
            assert headers["X-Kvemu-Replica"] == "replica-1"
        for rid in rids:
            http_json("POST", full.url + "/kv/release", {"remote_request_id": rid}, headers=cluster_auth())
        wait_for(lambda: cluster_row(router.url, "replica-0")["holds"] == "ok", timeout=5.0, what="the recovery")
    finally:
        stop_all(router, full, other)


def test_routed_imbalance_is_the_decode_pools_as_the_replay_counts_it():
    """/cluster's imbalance.routed is max / mean requests over the replicas that decode, what `kvemu replay` (by
    each answer's X-Kvemu-Replica) and `kvemu sim` report; the prefill pool's is apart. 3 requests round robin:
    decode-0 2, decode-1 1 (2 / 1.5 = 1.333); counting prefill-0's 3 too it was 3 / 2 = 1.5."""
    prefill = start_replica("--role", "prefill", replica_id="prefill-0")
    decoders = [start_replica("--role", "decode", replica_id=f"decode-{i}") for i in range(2)]
    router = None
    try:
        router = start_router([f"prefill={prefill.url}", *(f"decode={d.url}" for d in decoders)], "--pd-decider",
                              "always", routing="round_robin")
        answered: dict[str, int] = {}
        for i in range(3):
            _, headers = generate(router, list(range(i * 1000, i * 1000 + 200)), f"s{i}")
            answered[headers["X-Kvemu-Replica"]] = answered.get(headers["X-Kvemu-Replica"], 0) + 1
        assert sorted(answered.values()) == [1, 2]
        cluster = http_json("GET", router.url + "/cluster")[1]
        assert {r["replica_id"]: r["routed"] for r in cluster["replicas"]}["prefill-0"] == 3
        assert cluster["imbalance"]["routed"] == pytest.approx(2 / 1.5)
        assert cluster["pd"]["imbalance_routed"] == pytest.approx({"prefill": 1.0, "decode": 2 / 1.5})
        unpinned(prefill, *decoders)
    finally:
        stop_all(router, prefill, *decoders)
