"""Disaggregated prefill / decode through the router: vLLM's ``kv_transfer_params`` wire, driven as
llm-d's routing sidecar and vLLM's disaggregated proxy drive it.

A request to a cluster with prefill instances (``Cluster.disaggregated``):

1. the decode instance is chosen by the routing strategy over the decode pool (decode and colocated
   replicas; ``cache_aware`` reads the index's overlap of that pool: what each decoder already holds);
2. the decider (``RouterSettings.pd``, replica.core.disagg's ``PdSettings.remote``) is asked with the
   prompt and the tokens the chosen decoder holds (the index's prediction); a colocated (``both``)
   decoder always prefills its own requests;
3. if remote, a prefill instance is chosen by the strategy over the prefill pool (its own
   ``RoutingStep``), sent the request non-streaming with ``max_tokens: 1`` and
   ``kv_transfer_params: {"do_remote_decode": true, "do_remote_prefill": false}``; its answer's
   ``kv_transfer_params`` name the held KV;
4. the client's request goes to the decoder with those ``kv_transfer_params`` (the decoder pulls the
   KV), and the decoder's answer is passed back, streamed as it comes.

Both pools count the request in flight from the decision until the instance answered. A prefill
instance that is busy or failed is skipped for another; with none left, or an answer without
``kv_transfer_params``, the decoder prefills locally (counted: ``fallback``). So is one whose pool holds
for remote decodes exhaust (its ``/health`` says ``holds: exhausted``): a prompt sent there would wait
for room that may not come before the holds time out.

Holds end with their decode leg: once it ends, however (answered, failed and retried on another decoder,
its client gone), the router asks the prefill instance to release the hold (``POST /kv/release``, in the
background, counted in ``kvemu_router_pd_releases_total{outcome}``): a no-op where the decoder's pull
released it, as it usually has. Each prefill leg is named (``X-Kvemu-Hold-Id``) and released by that name,
so a leg whose answer the router never read (its client left between the legs, the instance stopped
answering) is released too, aborted if still computing. The prefill leg carries the cluster token, so the
prefill instance's per-client share (``--pd-hold-share``, replica/pd_share.py) bounds third-party
clients, not the router.

A client's own ``kv_transfer_params``: the router runs the transfer, so a client may not steer it.
``null``, ``{}`` and ``{"do_remote_decode": false, "do_remote_prefill": false}`` (what some clients
send by default) are ignored; anything else is a 400 naming the field. SGLang's ``bootstrap_host``,
``bootstrap_port`` and ``bootstrap_room`` are refused the same way (they would have a decode replica call
an address the client chose), in a colocated cluster too.

What the client reads for a remote request: the decoder's answer, with the hit that counts (the prefill
instance's cached tokens: where the prompt was computed) in ``usage.prompt_tokens_details.cached_tokens``
(``cached_tokens`` / ``cached_blocks`` on ``/generate``) and ``X-Kvemu-Cached-Tokens``; ``ttft_s`` and
``e2e_s`` (on ``/generate``, and in the OpenAI answers' ``kvemu`` section) add the prefill's ``e2e_s``
(the time to first token the client saw, in emulated seconds), and ``pd`` says what each side did. ``X-Kvemu-Pd`` names the path taken and
``X-Kvemu-Prefill-Replica`` the prefill instance.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgpack
from aiohttp import web

from router.cluster import ReplicaHandle
from router.request_path import (
    NoAnswer,
    Pool,
    RequestContext,
    Rewrite,
    Target,
    answer_from,
    exchange,
    read_body,
    record_prediction,
    relay,
    try_pool,
)
from router.strategies.base import cached_blocks
from router.upstream import ReplicaBusy, UpstreamRefused
from shared import protocol
from shared.errors import InputError
from shared.hashing import reusable_prefix_tokens
from shared.http_server import until_client_gone
from shared.protocol import (
    BOOTSTRAP_FIELDS,
    CACHED_TOKENS_HEADER,
    HOLD_NAME,
    KV_PARAMS,
    PD_PATH_HEADER,
    PREFILL_REPLICA_HEADER,
    REPLICA_HEADER,
)

PD_PATHS = ("remote", "local", "colocated", "fallback")  # how a request of a P/D cluster was prefilled
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False}
RELEASE_TIMEOUT_S = 2.0  # a release is one dict lookup on the prefill instance: longer means it is in trouble
_RELEASES: set[asyncio.Task] = set()  # releases in flight (release_hold)
# what the prefill request drops: it computes the prompt and one token, in one answer
_PREFILL_DROPS = ("stream", "stream_options", "max_completion_tokens", "output_tokens", "response_token_ids",
                  "response_block_hashes", "min_tokens")


@dataclass(slots=True)
class Prefilled:
    """A remote prefill's answer: who computed it, what it held, and the parameters the decoder sends."""

    replica_id: str
    params: dict
    cached_tokens: int | None  # the prefill instance's hit (None: it did not say)
    cached_blocks: int | None
    e2e_s: float  # emulated seconds the prefill took (its /generate timing; 0 when not reported)
    wall_s: float
    url: str = ""  # the prefill instance's, where its hold is released once the decode leg ends ...
    hold_id: str = ""  # ... by the name the router gave the leg (X-Kvemu-Hold-Id)


def client_params(obj: dict) -> None:
    """Refuse a client's ``kv_transfer_params`` or SGLang bootstrap fields, which would steer the router's
    transfer (module docstring) or have a replica call an address the client chose."""
    for name in BOOTSTRAP_FIELDS:
        if obj.get(name) is not None:
            raise InputError(name, "SGLang's bootstrap fields are set by a P/D router for its own prefill"
                                   " instances, never taken from a client: send the request without them")
    value = obj.get(KV_PARAMS)
    if value is None:
        return
    if not isinstance(value, dict):
        raise InputError(KV_PARAMS, f"expected an object, got {type(value).__name__}")
    if all(k in PREFILL_PARAMS and v is False for k, v in value.items()):
        return
    raise InputError(KV_PARAMS, "is set by the router of a P/D cluster, which runs the prefill and the KV transfer"
                             " itself; send the request without it (or with both do_remote_* false), or send it"
                             " to a replica directly")


def steers_transfer(raw: bytes) -> bool:
    """Whether a body may name transfer fields (one substring search each; client_params decides)."""
    return KV_PARAMS.encode() in raw or b"bootstrap_" in raw


def encode(obj: dict, content_type: str) -> bytes:
    if content_type.startswith((protocol.MSGPACK, "application/x-msgpack")):
        return msgpack.packb(obj)
    return json.dumps(obj, separators=(",", ":")).encode()


def decoded(body: bytes, content_type: str) -> dict | None:
    """A replica's answer as an object (None: not one)."""
    try:
        obj = protocol.decode_body(body, content_type)
    except InputError:
        return None
    return obj


def prefill_body(obj: dict) -> dict:
    out = {k: v for k, v in obj.items() if k not in _PREFILL_DROPS}
    out["max_tokens"] = 1
    out[KV_PARAMS] = dict(PREFILL_PARAMS)
    return out


def decoder_cached_tokens(overlap: dict, replica_id: str, num_blocks: int, prompt_tokens: int, block_size: int) -> int:
    """The prompt tokens the decoder would not compute, as the index predicts them."""
    return reusable_prefix_tokens(cached_blocks(overlap, replica_id, num_blocks) * block_size, prompt_tokens,
                                  block_size)


def goes_remote(state, rep: ReplicaHandle, ctx: RequestContext) -> bool:
    """The decider, for the chosen decoder (a colocated replica prefills its own requests)."""
    if rep.role != "decode":
        return False
    decider = state.settings.pd
    if decider is None:
        return True
    bs, spec = state.settings.block_size, ctx.spec
    return bool(decider.remote(spec.prompt_tokens, decoder_cached_tokens(ctx.overlap, rep.replica_id, len(spec.hashes),
                                                                         spec.prompt_tokens, bs), bs))


# ---- the prefill leg -----------------------------------------------------------------------------
async def remote_prefill(state, ctx: RequestContext) -> Prefilled | None:
    """A prefill instance computes the prompt and holds its KV (None: none could: the decoder prefills)."""
    pool = Pool("prefill", state.prefill_router, state.cluster.pool("prefill"))
    ctype = ctx.content_type or "application/json"
    data = encode(prefill_body(ctx.body()), ctype)
    # the cluster token in place of the client's Authorization: a prefill instance bounds the holds of clients
    # without it (--pd-hold-share); the router's are bounded by their decode legs (release_hold)
    headers = {"Content-Type": ctype, **{k: v for k, v in ctx.headers.items() if k in ("Authorization", "X-Session-Id")},
               **state.cluster.auth}
    try:
        return await try_pool(state, ctx, pool, lambda target: _prefill_leg(state, ctx, target, data, headers))
    except NoAnswer:
        return None


async def _prefill_leg(state, ctx: RequestContext, target: Target, data: bytes, headers: dict) -> Prefilled | None:
    """One prefill instance's try, named (``X-Kvemu-Hold-Id``) so that what it holds is released by that name
    once the decode leg ends, or now where its answer is never read (the client left, the instance failed)."""
    rep = target.rep
    name = uuid.uuid4().hex
    try:
        got = await _prefill_on(state, ctx, target, data, {**headers, HOLD_NAME: name})
    except (UpstreamRefused, ReplicaBusy):  # refused, or busy before admission: nothing held
        raise
    except BaseException:
        release_hold(state, rep.url, name)
        raise
    if got is not None:  # released once its decode leg ends (_serve)
        got.url, got.hold_id = rep.url, name
    return got


async def _prefill_on(state, ctx: RequestContext, target: Target, data: bytes, headers: dict) -> Prefilled | None:
    t0 = time.monotonic()
    up = await exchange(state, ctx, target, data, headers)
    async with up.response:
        body = await read_body(up)
        ctype = up.response.headers.get("Content-Type", "application/json")
        actual = up.response.headers.get(CACHED_TOKENS_HEADER)
        status = up.response.status
    wall = time.monotonic() - t0
    state.metrics.pd_prefill_seconds.observe(wall)
    if status >= 400:
        raise UpstreamRefused(status, body, ctype)
    answer = decoded(body, ctype) or {}
    params = answer.get(KV_PARAMS)
    if not isinstance(params, dict) or not params.get("do_remote_prefill"):
        return None  # an instance that does not hold KV for a remote decode: the decoder prefills
    cached = int(actual) if actual is not None and actual.isdigit() else _usage_cached(answer)
    if cached is not None and state.router.uses_index:
        spec = ctx.spec
        state.metrics.record_prediction(decoder_cached_tokens(ctx.overlap, target.rep.replica_id, len(spec.hashes),
                                                              spec.prompt_tokens, state.settings.block_size), cached)
    blocks = answer.get("cached_blocks")
    inner = answer.get("kvemu")
    kvemu: dict = inner if isinstance(inner, dict) else answer
    return Prefilled(target.rep.replica_id, params, cached, blocks if isinstance(blocks, int) else None,
                     float(kvemu.get("e2e_s", 0.0) or 0.0), wall)


# ---- what the client reads after a remote prefill ----------------------------------------------------
def _usage_cached(answer: dict) -> int | None:
    if isinstance(answer.get("cached_tokens"), int):
        return answer["cached_tokens"]
    usage = answer.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    value = details.get("cached_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) else None


def with_prefill(answer: dict, pre: Prefilled) -> dict:
    """The decoder's answer as the client reads it after a remote prefill (module docstring)."""
    if pre.cached_tokens is not None:
        usage = answer.get("usage")
        if isinstance(usage, dict):
            details = usage.setdefault("prompt_tokens_details", {})
            if isinstance(details, dict):
                decoded_hit = details.get("cached_tokens")
                details["cached_tokens"] = pre.cached_tokens
                answer.setdefault("kvemu", {})
                if isinstance(answer["kvemu"], dict):
                    answer["kvemu"]["pd"] = _pd_note(pre, decoded_hit)
                    _add_prefill_time(answer["kvemu"], pre)
        if isinstance(answer.get("cached_tokens"), int):  # /generate
            note = _pd_note(pre, answer["cached_tokens"], answer.get("cached_blocks"))
            answer["cached_tokens"] = pre.cached_tokens
            if pre.cached_blocks is not None:
                answer["cached_blocks"] = pre.cached_blocks
            _add_prefill_time(answer, pre)
            answer["pd"] = note
    return answer


def _add_prefill_time(times: dict, pre: Prefilled) -> None:
    """The time to first token and end to end the client saw include the remote prefill."""
    for key in ("ttft_s", "e2e_s"):
        if isinstance(times.get(key), (int, float)):
            times[key] += pre.e2e_s


def _pd_note(pre: Prefilled, decoder_tokens: Any, decoder_blocks: Any = None) -> dict:
    note = {"prefill_replica_id": pre.replica_id, "prefill_cached_tokens": pre.cached_tokens,
            "prefill_e2e_s": pre.e2e_s, "decoder_cached_tokens": decoder_tokens}
    if decoder_blocks is not None:
        note["decoder_cached_blocks"] = decoder_blocks
    return note


def rewrite_event(event: bytes, pre: Prefilled) -> bytes:
    """One server-sent event of the decoder's stream: its usage chunk (if asked for) gets the prefill's hit."""
    if b"prompt_tokens_details" not in event or not event.startswith(b"data: "):
        return event
    try:
        obj = json.loads(event[6:])
    except ValueError:
        return event
    if not isinstance(obj, dict):
        return event
    return b"data: " + json.dumps(with_prefill(obj, pre), separators=(",", ":")).encode()


def answer_body(body: bytes, content_type: str, pre: Prefilled) -> bytes:
    """A whole answer of the decoder after a remote prefill, as the client reads it (``with_prefill``)."""
    answer = decoded(body, content_type)
    return body if answer is None else encode(with_prefill(answer, pre), content_type)


# ---- the request's path ----------------------------------------------------------------------
async def route(state, ctx: RequestContext) -> web.StreamResponse:
    """Route one request of a P/D cluster: the decoder, then (if the decider says so) a remote prefill."""
    obj = ctx.body()
    client_params(obj)
    if KV_PARAMS in obj:  # a harmless one (client_params): not passed on
        del obj[KV_PARAMS]
        ctx.raw = encode(obj, ctx.content_type)
    pool = Pool("decode", state.router, state.cluster.pool("decode"))
    return await answer_from(state, ctx, pool, lambda target: _serve(state, ctx, target))


async def _serve(state, ctx: RequestContext, target: Target) -> web.StreamResponse:
    pre = None
    async with until_client_gone(ctx.request):  # as every answer_from attempt (router/request_path.py)
        if target.rep.role != "decode":
            path = "colocated"
        elif goes_remote(state, target.rep, ctx):
            pre = await remote_prefill(state, ctx)
            path = "remote" if pre is not None else "fallback"
        else:
            path = "local"
        state.metrics.pd_path(path)
        try:
            return await _decode_on(state, ctx, target, path, pre)
        finally:  # the decode leg ended (answered, failed, its client gone): nothing will pull the hold any more
            if pre is not None:
                release_hold(state, pre.url, pre.hold_id)


def release_hold(state, url: str, name: str) -> None:
    """Ask the prefill instance at ``url`` to release what the leg named ``name`` holds (``POST /kv/release``),
    in the background: a no-op where the decoder's pull released it, else its blocks go back now rather than
    at --pd-hold-timeout-s (a leg still computing is aborted, one not arrived yet refused when it does)."""
    task = asyncio.get_running_loop().create_task(_release(state, url, name))
    _RELEASES.add(task)  # (the loop keeps only a weak reference to a task)
    task.add_done_callback(_RELEASES.discard)


async def _release(state, url: str, name: str) -> None:
    try:
        async with state.cluster.session.post(url + "/kv/release", json={"hold_id": name},
                                              headers=state.cluster.auth,
                                              timeout=aiohttp.ClientTimeout(total=RELEASE_TIMEOUT_S)) as resp:
            answer = await resp.json() if resp.status == 200 else None
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
        answer = None
    # failed: the hold ends at the prefill instance's --pd-hold-timeout-s, or when it restarts
    outcome = "failed" if not isinstance(answer, dict) else "released" if answer.get("released") else "not_held"
    state.metrics.pd_release(outcome)


async def _decode_on(state, ctx: RequestContext, target: Target, path: str, pre: Prefilled | None
                     ) -> web.StreamResponse:
    rep, spec = target.rep, ctx.spec
    data = ctx.raw if pre is None else encode({**ctx.body(), KV_PARAMS: pre.params}, ctx.content_type)
    expected = None
    if pre is None and ctx.predicted:
        expected = decoder_cached_tokens(ctx.overlap, rep.replica_id, len(spec.hashes), spec.prompt_tokens,
                                         state.settings.block_size)
    t0 = time.monotonic()
    up = await exchange(state, ctx, target, data, dict(ctx.headers))
    async with up.response:
        state.metrics.pd_first_byte(path, time.monotonic() - t0)
        actual = up.response.headers.get(CACHED_TOKENS_HEADER)
        record_prediction(state, expected, actual)
        out = {"Content-Type": up.response.headers.get("Content-Type", "application/json"),
               REPLICA_HEADER: rep.replica_id, PD_PATH_HEADER: path}
        if pre is not None:
            out[PREFILL_REPLICA_HEADER] = pre.replica_id
            actual = str(pre.cached_tokens) if pre.cached_tokens is not None else actual
        if actual is not None:
            out[CACHED_TOKENS_HEADER] = actual
        # after a remote prefill the answer (its usage chunk, when streamed) carries the prefill's hit
        rewrite = None if pre is None else Rewrite(lambda event: rewrite_event(event, pre),
                                                   lambda body, ctype: answer_body(body, ctype, pre))
        return await relay(state, ctx, up, out, rewrite)
