"""The router's one request path (router/request_path.py) in process, without a replica: the pick and the retry
loop that the colocated path and both P/D legs share (an unhealthy replica skipped, a failed one taken out and
another tried, the in-flight and queued-token gauges kept alike in every pool), and the pure helpers of
router/pd_legs.py and shared/protocol.py that rewrite and check what crosses the wire, hand-worked."""

from __future__ import annotations

import asyncio
import json
import time

import msgpack
import pytest
from aiohttp.test_utils import make_mocked_request

from router.pd_legs import Prefilled, answer_body, client_params, prefill_body, rewrite_event, with_prefill
from router.request_path import NoAnswer, Pool, RequestContext, Target, try_pool
from router.settings import RouterSettings
from router.state import RouterState
from router.upstream import ReplicaBusy, ReplicaFailed
from shared.errors import InputError
from shared.protocol import GenerateSpec, parse_params, transfer_params

PROMPT_TOKENS = 64  # four blocks of 16, none cached anywhere: each pick queues all 64 on its replica


def cluster(pool_name: str) -> tuple[RouterState, Pool]:
    """Three replicas x0 (unhealthy), x1, x2 in the named pool, routed round robin; a P/D cluster has one
    replica of the other role beside them."""
    role = {"replica": "both", "decode": "decode", "prefill": "prefill"}[pool_name]
    other = {"replica": (), "decode": ("prefill",), "prefill": ("decode",)}[pool_name]
    roles = (role,) * 3 + other
    urls = tuple(f"http://127.0.0.1:{9000 + i}" for i in range(len(roles)))
    state = RouterState(RouterSettings(replicas=urls, roles=roles, routing="round_robin", retries=1))
    for i, rep in enumerate(state.cluster.replicas):
        rep.state.replica_id = f"x{i}" if i < 3 else "other"
        rep.state.healthy = i != 0
    step = state.prefill_router if pool_name == "prefill" else state.router
    replicas = state.cluster.replicas if pool_name == "replica" else state.cluster.pool(pool_name)
    return state, Pool(pool_name, step, replicas)


def context() -> RequestContext:
    spec = GenerateSpec(hashes=[1, 2, 3, 4], prompt_tokens=PROMPT_TOKENS, max_tokens=2, session=None, stream=False,
                        kind="generate")
    return RequestContext.of(make_mocked_request("POST", "/generate"), b"{}", spec)


def gauges(state: RouterState, replica_id: str) -> tuple[float, float]:
    totals = state.metrics.totals()
    return totals.in_flight.get(replica_id, -1), totals.queued_tokens.get(replica_id, -1)


@pytest.mark.parametrize("pool_name", ["replica", "decode", "prefill"])
def test_every_pool_skips_an_unhealthy_replica_retries_a_failed_one_and_keeps_the_gauges(pool_name):
    state, pool = cluster(pool_name)
    seen: list[tuple[str, tuple[float, float]]] = []

    async def attempt(target: Target) -> str:
        seen.append((target.rep.replica_id, gauges(state, target.rep.replica_id)))
        if len(seen) == 1:
            raise ReplicaFailed("connection refused")
        return "answered"

    assert asyncio.run(try_pool(state, context(), pool, attempt)) == "answered"
    # x0 is never tried; x1 failed and x2 answered, each counted in flight with its whole prompt queued meanwhile
    assert seen == [("x1", (1, PROMPT_TOKENS)), ("x2", (1, PROMPT_TOKENS))]
    assert [gauges(state, rid) for rid in ("x1", "x2")] == [(0, 0), (0, 0)]  # whatever ended each attempt
    assert [r.state.healthy for r in pool.replicas] == [False, False, True]  # the failed one taken out
    totals = state.metrics.totals()
    assert totals.routed == {"x1": 1, "x2": 1}
    assert state.metrics.registry.get_sample_value("kvemu_router_retries_total") == 1
    # the router's decisions (the dashboard's) count a colocated cluster's and a decode pool's, not a prefill pool's
    assert totals.decisions == ({} if pool_name == "prefill" else {"round_robin": 2})
    assert totals.pd_decisions == ({} if pool_name == "replica" else {pool_name: {"round_robin": 2}})


def test_a_healthy_replica_backing_off_is_tried_before_an_unhealthy_one_is_left_alone():
    """Every healthy replica backing off after a busy answer (and only the unhealthy one not): one of them is
    tried rather than the request refused; busy answers from all of them end in NoAnswer, counted as busy."""
    state, pool = cluster("replica")
    for rep in pool.replicas[1:]:
        rep.busy_until = time.monotonic() + 60
    tried: list[str] = []

    async def busy(target: Target) -> str:
        tried.append(target.rep.replica_id)
        raise ReplicaBusy()

    with pytest.raises(NoAnswer) as none:
        asyncio.run(try_pool(state, context(), pool, busy))
    assert tried == ["x1", "x2"] and (none.value.busy, none.value.failures) == (2, 0)
    assert [r.state.healthy for r in pool.replicas] == [False, True, True]  # busy is not failed


PRE = Prefilled("prefill-0", {"do_remote_prefill": True}, cached_tokens=256, cached_blocks=16, e2e_s=0.25, wall_s=0.3)
NOTE = {"prefill_replica_id": "prefill-0", "prefill_cached_tokens": 256, "prefill_e2e_s": 0.25}


def test_with_prefill_gives_the_client_the_prefill_instances_hit_and_time():
    openai = {"usage": {"prompt_tokens": 320, "prompt_tokens_details": {"cached_tokens": 0}},
              "kvemu": {"ttft_s": 0.5, "e2e_s": 1.0}}
    assert with_prefill(openai, PRE) == {"usage": {"prompt_tokens": 320, "prompt_tokens_details": {"cached_tokens": 256}},
                                         "kvemu": {"ttft_s": 0.75, "e2e_s": 1.25,
                                                   "pd": {**NOTE, "decoder_cached_tokens": 0}}}
    generate = {"cached_tokens": 304, "cached_blocks": 19, "ttft_s": 0.5, "e2e_s": 0.75}
    assert with_prefill(generate, PRE) == {"cached_tokens": 256, "cached_blocks": 16, "ttft_s": 0.75, "e2e_s": 1.0,
                                           "pd": {**NOTE, "decoder_cached_tokens": 304, "decoder_cached_blocks": 19}}
    silent = Prefilled("prefill-0", {}, None, None, 0.25, 0.3)  # a prefill instance that did not say its hit
    assert with_prefill({"cached_tokens": 304, "e2e_s": 0.5}, silent) == {"cached_tokens": 304, "e2e_s": 0.5}


def test_rewrite_event_changes_only_a_usage_chunk():
    usage = b'data: {"choices":[],"usage":{"prompt_tokens_details":{"cached_tokens":0}}}'
    expected = {"choices": [], "usage": {"prompt_tokens_details": {"cached_tokens": 256}},
                "kvemu": {"pd": {**NOTE, "decoder_cached_tokens": 0}}}
    assert rewrite_event(usage, PRE) == b"data: " + json.dumps(expected, separators=(",", ":")).encode()
    for same in (b'data: {"choices":[{"text":"a"}]}', b"data: [DONE]", b'data: {"prompt_tokens_details": oops',
                 b': comment prompt_tokens_details', b'data: ["prompt_tokens_details"]'):
        assert rewrite_event(same, PRE) is same


def test_answer_body_keeps_the_content_type_and_passes_what_is_not_an_object():
    body = msgpack.packb({"cached_tokens": 0, "output_tokens": 2})
    assert msgpack.unpackb(answer_body(body, "application/msgpack", PRE)) == {
        "cached_tokens": 256, "cached_blocks": 16, "output_tokens": 2, "pd": {**NOTE, "decoder_cached_tokens": 0}}
    assert answer_body(b"not json", "application/json", PRE) == b"not json"


def test_client_params_refuses_steering_and_prefill_body_asks_for_one_held_token():
    for harmless in ({}, {"kv_transfer_params": None}, {"kv_transfer_params": {}},
                     {"kv_transfer_params": {"do_remote_decode": False, "do_remote_prefill": False}}):
        client_params(harmless)
    for body, field in (({"kv_transfer_params": {"do_remote_decode": True}}, "kv_transfer_params"),
                        ({"kv_transfer_params": "yes"}, "kv_transfer_params"),
                        ({"bootstrap_room": 7}, "bootstrap_room")):
        with pytest.raises(InputError) as refused:
            client_params(body)
        assert refused.value.field == field
    asked = {"prompt": "hi", "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 50,
             "min_tokens": 5, "temperature": 0}
    assert prefill_body(asked) == {"prompt": "hi", "max_tokens": 1, "temperature": 0,
                                   "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False}}


def test_kv_transfer_params_parsed_field_by_field():
    assert transfer_params(b'{"prompt": "hi"}', "application/json") is None  # not named: never decoded
    raw = json.dumps({"kv_transfer_params": {"do_remote_prefill": True, "remote_host": "10.0.0.2", "remote_port": 8001,
                                             "remote_request_id": "r1", "remote_block_ids": [[0, 1], [2]],
                                             "remote_engine_id": 3}}).encode()
    params = transfer_params(raw, "application/json")
    assert params is not None and (params.remote_block_ids, params.remote_engine_id) == ((0, 1, 2), "3")
    for value, field in (({"do_remote_decode": True, "do_remote_prefill": True}, "kv_transfer_params.do_remote_prefill"),
                         ({"do_remote_prefill": True, "remote_host": "h", "remote_port": 1},
                          "kv_transfer_params.remote_request_id"),
                         ({"remote_port": 70000}, "kv_transfer_params.remote_port"),
                         ({"remote_block_ids": [0, -1]}, "kv_transfer_params.remote_block_ids[1]")):
        with pytest.raises(InputError) as refused:
            parse_params(value)
        assert refused.value.field == field
