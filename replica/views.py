"""HTTP handlers of the replica: OpenAI-compatible, native /generate, health, metrics, stats, admin."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import cast

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from replica import pd_views, sglang_pd
from replica.core.cache.group_usage import grouped_pool, kv_groups_now
from replica.core.cache.policies import make_policy
from replica.dp import DpEngine, instance_pool_stats
from replica.engine import Handle
from replica.events import read_feed
from replica.httputil import require_admin
from replica.runtime import RUNTIME, SETTINGS, ReplicaRuntime
from replica.settings import ReplicaSettings
from shared import protocol
from shared.auth import require_cluster_token, session_label, wants_raw_sessions
from shared.errors import InputError
from shared.http_server import ClientGone, until_client_gone
from shared.httpkit import query_int, read_body, read_raw, respond, wants_msgpack
from shared.model_kinds import served_model
from shared.offload import OFFLOAD
from shared.protocol import CACHED_TOKENS_HEADER, KV_PARAMS, REPLICA_HEADER, KvTransferParams, transfer_params
from shared.tokenizer import filler_piece, filler_text


def _state(request: web.Request) -> ReplicaRuntime:
    return request.app[RUNTIME]


def _settings(request: web.Request) -> ReplicaSettings:
    return request.app[SETTINGS]


def _limits(request) -> tuple[int, int]:
    s = _settings(request)
    return s.serving.max_prompt_tokens, s.serving.max_output_tokens


async def _parse(request: web.Request) -> tuple[protocol.GenerateSpec, KvTransferParams | None]:
    """Big bodies are parsed off the event loop (shared/offload.py); with them, vLLM's
    ``kv_transfer_params`` where the body has them (replica/pd.py)."""
    raw = await read_raw(request)
    settings = _settings(request)
    spec = await request.app[OFFLOAD].parse(request, raw, settings.block_size, _limits(request))
    if settings.knobs.matching == "radix" and spec.block_tokens is None:
        raise InputError("block_hashes", f"this replica matches prompts token by token (--matching radix, pages of"
                                         f" {settings.block_size}), which block hashes cannot be cut into: send"
                                         " token_ids, a completion prompt or chat messages")
    params = transfer_params(raw, request.content_type or "")
    if params is None:  # SGLang's bootstrap fields (sglang-router's P/D mode), where the body has them
        params = await sglang_pd.bootstrap_params(request, raw)
    return spec, params


def _submit(request: web.Request, spec: protocol.GenerateSpec, hold: bool = False) -> Handle:
    keep = _settings(request).stored_response_kv == "keep"  # a prefill replica never stores it
    state = _state(request)
    handle = state.engine.submit(spec.hashes, spec.prompt_tokens, spec.max_tokens, spec.session, spec.stream,
                                 spec.response_hashes if keep else None, hold, asked_rank(request))
    state.register_blocks(spec.hashes, spec.response_hashes if keep else None, spec.block_tokens, handle.dp_rank)
    return handle


def asked_rank(request: web.Request) -> int | None:
    """The data-parallel rank vLLM's ``X-data-parallel-rank`` header names (None: the replica balances); a value
    that is no integer is a 400 naming the header and the ranks (one out of range, the engine's: the same 400)."""
    value = request.headers.get(protocol.DP_RANK_HEADER)
    if value is None:
        return None
    text = value.strip()
    digits = text[1:] if text.startswith("-") else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 9:
        ranks = len(_state(request).cores)
        raise InputError(protocol.DP_RANK_HEADER, f"must be a rank from 0 to {ranks - 1}, got {value[:40]!r}")
    return int(text)


async def _until(request: web.Request, handle: Handle, fut) -> bool:
    """Wait for ``fut`` (the request done, or its first token); if the client goes first, abort
    the request (vLLM does: its blocks go back, it counts as aborted) and return False."""
    try:
        async with until_client_gone(request):
            await fut
        return True
    except ClientGone:
        _state(request).engine.abort(handle)
        return False


async def _start(request: web.Request) -> tuple[protocol.GenerateSpec, Handle | None]:
    """Parse and submit, as a plain request or either leg of a disaggregated one (replica/pd_views.py).
    A None handle: the client left while its KV was on the way."""
    spec, params = await _parse(request)
    return spec, await pd_views.start(request, spec, params, _submit)


def _held(request: web.Request, handle: Handle) -> dict:
    """The prefill leg of a remote decode: its blocks held for the pull, and what its answer carries."""
    if handle.kv_transfer_params is None and handle.req.hold:
        _state(request).pd.hold(handle)
        sglang_pd.held(request, handle)
    return {KV_PARAMS: handle.kv_transfer_params} if handle.kv_transfer_params is not None else {}


def _gone() -> web.Response:
    """What a handler returns for a client that left: nobody reads it (499, as nginx logs it)."""
    return web.Response(status=499)


def _usage(handle: Handle) -> dict:
    r = handle.req
    return {"prompt_tokens": r.input_tokens, "completion_tokens": r.output_tokens,
            "total_tokens": r.input_tokens + r.output_tokens,
            "prompt_tokens_details": {"cached_tokens": r.cached_tokens}}


# ---- native --------------------------------------------------------------------------
async def generate(request: web.Request) -> web.StreamResponse:
    s = _settings(request)
    _spec, handle = await _start(request)
    if handle is None:
        return _gone()
    if protocol.HEAD_AT_FIRST_TOKEN in request.headers:
        ctype = protocol.MSGPACK if wants_msgpack(request) else "application/json; charset=utf-8"  # as respond's
        return await _head_at_first_token(request, handle, ctype,
                                          lambda: cast(bytes, respond(request, _generate_body(request, handle)).body))
    if not await _until(request, handle, handle.done):
        return _gone()
    resp = respond(request, _generate_body(request, handle))
    resp.headers.update(_replica_headers(s.replica_id, handle))
    return resp


def _generate_body(request: web.Request, handle: Handle) -> dict:
    r = handle.req
    alloc = r.alloc
    return {"replica_id": _settings(request).replica_id, "prompt_tokens": r.input_tokens,
            "output_tokens": r.output_tokens, "cached_tokens": r.cached_tokens, "prompt_blocks": len(r.hashes),
            # (a held prefill's blocks may have been pulled and released, its allocation gone, by now)
            "cached_blocks": len(alloc.hit_idx) if alloc is not None else None,
            "holes": alloc.holes if alloc is not None else None, **handle.timings(), **_held(request, handle),
            **({"dp_rank": handle.dp_rank} if _state(request).dp_ranks else {})}


async def _head_at_first_token(request: web.Request, handle: Handle, content_type: str,
                               body: Callable[[], bytes]) -> web.StreamResponse:
    """A non-streamed answer whose status and headers leave at the first token, as a stream's do, and whose body
    leaves at the end: what the router asks (``protocol.HEAD_AT_FIRST_TOKEN``) to learn when the prefill ended, so
    that a decoding request stops counting as queued prefill (router/strategies/step.py). A client that leaves
    aborts the request, as it does a streamed one."""
    if not await _until(request, handle, handle.first_token):
        return _gone()
    resp = web.StreamResponse(headers={"Content-Type": content_type,
                                       **_replica_headers(_settings(request).replica_id, handle)})
    try:
        async with until_client_gone(request):
            await resp.prepare(request)
            await handle.done
            await resp.write(body())
            await resp.write_eof()
    except (ConnectionResetError, ClientGone):
        _state(request).engine.abort(handle)  # a no-op once it finished (the end was being written)
    return resp


def _replica_headers(replica_id: str, handle: Handle) -> dict:
    """Lets a router learn the actual reuse without parsing the body (predicted vs actual)."""
    return {REPLICA_HEADER: replica_id, CACHED_TOKENS_HEADER: str(handle.req.cached_tokens)}


# ---- OpenAI-compatible ----------------------------------------------------------------
async def completions(request: web.Request) -> web.StreamResponse:
    return await _openai(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _openai(request, chat=True)


async def _openai(request: web.Request, chat: bool) -> web.StreamResponse:
    s = _settings(request)
    spec, handle = await _start(request)
    if handle is None:
        return _gone()
    rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
    created = int(time.time())
    if spec.stream:
        return await _stream(request, handle, spec, rid, created, chat)
    if protocol.HEAD_AT_FIRST_TOKEN in request.headers:
        return await _head_at_first_token(request, handle, "application/json; charset=utf-8",
                                          lambda: json.dumps(_completion(request, handle, spec, rid, created,
                                                                         chat)).encode())
    if not await _until(request, handle, handle.done):
        return _gone()
    return web.json_response(_completion(request, handle, spec, rid, created, chat),
                             headers=_replica_headers(s.replica_id, handle))


def _completion(request: web.Request, handle: Handle, spec, rid: str, created: int, chat: bool) -> dict:
    """A non-streamed OpenAI answer, once the request is done."""
    text = filler_text(handle.req.output_tokens, _text_seed(handle))
    choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"} if chat
              else {"index": 0, "text": text, "finish_reason": "length", "logprobs": None})
    return {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": created,
            "model": spec.model, "choices": [choice], "usage": _usage(handle),
            "kvemu": {"replica_id": _settings(request).replica_id, **handle.timings()}, **_held(request, handle)}


def _text_seed(handle: Handle) -> int:
    """The same prompt gets the same words, streamed or not."""
    r = handle.req
    return protocol.response_seed(list(r.hashes[-1:]), r.input_tokens)


async def _stream(request, handle: Handle, spec, rid: str, created: int, chat: bool) -> web.StreamResponse:
    s = _settings(request)
    # headers carry the cached tokens, known once the request is admitted
    if not await _until(request, handle, handle.first_token):
        return _gone()
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       **_replica_headers(s.replica_id, handle)})
    head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion", "created": created,
            "model": spec.model}
    try:
        async with until_client_gone(request):
            await resp.prepare(request)
            await _write_events(resp, handle, spec, head, chat, s.replica_id, request)
    except (ConnectionResetError, ClientGone):  # the client left, or was cut off for not reading (shared/http_server.py)
        _state(request).engine.abort(handle)  # a no-op once it finished (the end was being written)
    return resp


async def _write_events(resp: web.StreamResponse, handle: Handle, spec, head: dict, chat: bool,
                        replica_id: str, request: web.Request) -> None:
    sent = 0
    assert handle.tokens is not None  # a streamed request has a token queue
    while True:
        n = await handle.tokens.get()
        if n is None:
            break
        text = filler_piece(_text_seed(handle), sent, n)  # the pieces concatenate to the non-streamed text
        if chat:
            delta = {"role": "assistant", "content": text} if sent == 0 else {"content": text}
            choice = {"index": 0, "delta": delta, "finish_reason": None}
        else:
            choice = {"index": 0, "text": text, "finish_reason": None, "logprobs": None}
        sent += n
        await resp.write(_sse({**head, "choices": [choice]}))
    end = ({"index": 0, "delta": {}, "finish_reason": "length"} if chat
           else {"index": 0, "text": "", "finish_reason": "length", "logprobs": None})
    await resp.write(_sse({**head, "choices": [end], "kvemu": {"replica_id": replica_id, **handle.timings()},
                           **_held(request, handle)}))
    if spec.include_usage:  # as OpenAI sends it: a last chunk with no choices, only when asked
        await resp.write(_sse({**head, "choices": [], "usage": _usage(handle)}))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()


def _sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


# ---- monitoring ----------------------------------------------------------------------
def models_body(names: list[str], created: int) -> dict:
    """``GET /v1/models``: what OpenAI clients list (``client.models.list()``)."""
    return {"object": "list", "data": [{"id": n, "object": "model", "created": created, "owned_by": "kvemu"}
                                       for n in names]}


async def models(request: web.Request) -> web.Response:
    state = _state(request)
    return web.json_response(models_body([served_model(_settings(request).model)], int(state.started)))


def _store_keys(value) -> dict:
    """The shared KV store as this replica sees it: ``shared_store``, and under its name until this release,
    ``shared_pool``, for one more (scripts read it)."""
    return {"shared_store": value, "shared_pool": value}


async def health(request: web.Request) -> web.Response:
    state = _state(request)
    s = _settings(request)
    return web.json_response({"status": "ok", "replica_id": s.replica_id, "role": s.role, "epoch": state.feed.epoch,
                              "policy": state.pool.policy.name, "model": served_model(s.model),
                              "capacity_blocks": sum(pool.capacity for pool in state.pools),
                              "data_parallel_size": len(state.cores),  # the router keys its index by rank
                              "block_size": s.block_size, "matching": s.knobs.matching, "running": state.running,
                              "waiting": state.waiting, "kv_usage": state.kv_usage(),
                              **state.pd.hold_health(),  # P/D: what prefills held for remote decodes pin
                              # the shared KV store: ok, unreachable (serving from its own levels) or connecting
                              **(_store_keys(state.store_client.state) if state.store_client is not None else {})})


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(_state(request).registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def stats(request: web.Request) -> web.Response:
    state = _state(request)
    s = _settings(request)
    top = query_int(request, "top", 10, 1, 1000)
    out = instance_pool_stats(state.pools, top) if state.dp_ranks else state.pool.stats(top_k=top)
    # held by running requests beyond their hashed blocks (decode KV)
    out["private_blocks"] = sum(pool.private for pool in state.pools)
    if not wants_raw_sessions(request, s.serving.cluster_token):
        for row in out["top_sessions"]:
            row["session"] = session_label(row["session"], s.serving.cluster_token)
    out.update({
        "replica_id": s.replica_id, "model": state.cost.model.name, "kv_cache_dtype": state.cost.model.kv_cache_dtype,
        "gpu": state.cost.gpu.name,
        # the pool's capacity_blocks (its own unit: blocks of block_size tokens, pages under radix) as
        # tokens and bytes too, which mean one memory in either matching mode
        "capacity_tokens": out["capacity_blocks"] * s.block_size,
        "capacity_bytes": out["capacity_blocks"] * state.cost.block_bytes(s.block_size),
        "capacity_gib": state.cost.blocks_to_gib(out["capacity_blocks"], s.block_size),
        "time_scale": s.time_scale, "uptime_s": time.time() - state.started,
        "scheduler": {**state.scheduler.stats(),
                      "running": state.running, "waiting": state.waiting,
                      "queued_prefill_tokens": sum(core.scheduler.queued_prefill_tokens for core in state.cores),
                      "steps": state.engine.counters.steps, "finished": state.engine.counters.finished,
                      "aborted": state.engine.counters.aborted,
                      "emulated_busy_s": state.engine.counters.emulated_busy_s,
                      "emulated_now_s": state.engine.now()},
        "events": state.feed.stats(), "rejected_by_field": dict(state.rejected),
        "ttft": state.ttft_recent.summary(), "policy_switches": list(state.policy_switches),
        "role": s.role, "pd": state.pd.stats(),
    })
    if s.gpu_memory_utilization is not None:  # vLLM's memory rule sized the pool: its terms, bytes per GPU
        out["memory_rule"] = s.kv_budget().breakdown()
    # several KV cache groups (a sliding-window model): each group's blocks, every rank's (none for one group)
    groups = kv_groups_now((pool, core.scheduler.running) for core in state.cores
                           if (pool := grouped_pool(core.scheduler.pool)) is not None)
    if groups is not None:
        out["kv_groups"] = groups
    if state.dp_ranks:  # --data-parallel-size: each rank's figures beside the totals above (replica/dp.py)
        assert isinstance(state.engine, DpEngine)
        out["data_parallel"] = {"size": s.dp.size, "expert_parallel": s.dp.expert_parallel,
                                "ranks": state.engine.rank_stats()}
    if state.vllm_events:  # --kv-events-config: vLLM's KV events over ZMQ (one publisher a rank)
        out["kv_events"] = state.vllm_events[0].stats()
        if state.dp_ranks:
            out["kv_events"]["ranks"] = [publisher.stats() for publisher in state.vllm_events]
    if state.backend is not None:  # --backend torch: what the real kernels did
        out["backend"] = {"name": s.backend, "device": s.device, **state.backend.counters}
        if state.backend.mover is not None:  # the tier copies it made
            out["backend"]["tier_copies"] = dict(state.backend.mover.counters)
    if state.shipper is not None:
        out["index_shipper"] = state.shipper.stats()
    if state.core.tiers is not None:
        out["tiers"] = state.core.tiers.stats()
    if state.store_client is not None:  # the shared KV store as this replica sees it (replica/kvstore/client.py)
        out.update(_store_keys(state.store_client.stats()))
    return respond(request, out)


async def kv_events(request: web.Request) -> web.Response:
    """The embedded index's feed: batches after sequence number ``after`` (cluster token)."""
    require_cluster_token(request, _settings(request).serving.cluster_token)
    state = _state(request)
    return respond(request, await read_feed(request, state.feed, _settings(request).replica_id, state.feed_changed))


async def kv_resync(request: web.Request) -> web.Response:
    """Republish the whole resident set (``cleared`` + ``stored``): routers call it when they
    (re)gain sight of this replica. Cluster token; asks in a row cost one resync."""
    require_cluster_token(request, _settings(request).serving.cluster_token)
    state = _state(request)
    state.feed.request_resync()
    return web.json_response({"epoch": state.feed.epoch, "next_seq": state.feed.next_seq,
                              "resident_blocks": sum(pool.used for pool in state.pools)})


# ---- admin ---------------------------------------------------------------------------
async def admin_policy(request: web.Request) -> web.Response:
    require_admin(request)
    obj = await read_body(request)
    name = obj.get("policy")
    if not isinstance(name, str):
        raise InputError("policy", "expected a policy name")
    params = obj.get("params", {})
    if not isinstance(params, dict):
        raise InputError("params", "expected an object")
    policy = make_policy(name, **params)  # a bad parameter is an InputError naming it
    if policy.needs_future:
        raise InputError("policy", f"{name} is an offline oracle; it runs in `kvemu sim` only")
    state = _state(request)
    old = state.pool.policy.name
    state.pool.set_policy(policy, state.engine.now())
    for pool in state.pools[1:]:  # every data-parallel rank its own instance of the policy
        pool.set_policy(make_policy(name, **params), state.engine.now())
    state.policy_switches.append({"at": time.time(), "from": old, "to": policy.name})
    return web.json_response({"policy": policy.describe(), "previous": old,
                              "resident_blocks": sum(pool.used for pool in state.pools)})


async def admin_reset(request: web.Request) -> web.Response:
    require_admin(request)
    state = _state(request)
    dropped = sum(pool.reset() for pool in state.pools)
    state.engine.publish_events()
    return web.json_response({"dropped_blocks": dropped, "resident_blocks": sum(pool.used for pool in state.pools)})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/generate", generate)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/stats", stats)
    app.router.add_get("/kv/events", kv_events)
    app.router.add_post("/kv/resync", kv_resync)
    app.router.add_post("/admin/policy", admin_policy)
    app.router.add_post("/admin/reset", admin_reset)
