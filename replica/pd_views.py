"""HTTP side of disaggregated prefill and decode (replica/pd.py): the pull endpoint a decode instance
calls on a prefill instance, the release endpoint kvemu's router calls there once a decode leg ended, and
how a generation request is started in either leg."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from replica.engine import Handle
from replica.pd import check_role
from replica.runtime import RUNTIME, SETTINGS
from shared import protocol
from shared.auth import bearer_ok, require_cluster_token
from shared.errors import InputError
from shared.http_server import ClientGone, until_client_gone
from shared.httpkit import read_body
from shared.protocol import HOLD_NAME, KV_PARAMS, KvTransferParams

Submit = Callable[..., Handle]
MAX_PULL_BYTES = 1 << 50


async def kv_pull(request: web.Request) -> web.Response:
    """``POST /kv/pull`` (the hold's own credential, or the cluster token): a decode instance reads a held
    prefill's KV. Body
    ``{"remote_request_id": str, "bytes": int >= 0, "decoder": str}``; answers ``{"ok": true, "send_s":
    emulated seconds on this NIC's send link}`` once sent, the blocks released. 404: not held here
    (never prefilled for a remote decode, pulled already, or timed out)."""
    settings = request.app[SETTINGS]
    pd = request.app[RUNTIME].pd
    obj = await read_body(request)
    rid = obj.get("remote_request_id")
    if not isinstance(rid, str) or not rid:
        raise InputError("remote_request_id", f"expected the id a prefill answer's {KV_PARAMS} gave, got {rid!r:.60}")
    # A held request opens to its own credential (or the cluster token); an id not held is a 404 below
    # whatever is presented (a pull after the timeout carries a credential that opens nothing now)
    if rid in pd.held and not pd.may_pull(rid, request.headers.get("Authorization", "")):
        require_cluster_token(request, settings.serving.cluster_token)
    nbytes = obj.get("bytes")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 0 <= nbytes <= MAX_PULL_BYTES:
        raise InputError("bytes", f"expected an integer in [0, 2**50], got {nbytes!r:.40}")
    decoder = obj.get("decoder")
    if not isinstance(decoder, str) or not decoder:
        raise InputError("decoder", f"expected the decode instance's id, got {decoder!r:.60}")
    if rid not in pd.held:
        pd.counters.pulls_unknown += 1
        return web.json_response(protocol.error_body(
            404, "remote_request_id", f"remote_request_id: {rid!r:.80} is not held by replica {settings.replica_id}:"
            " it was never prefilled here for a remote decode, was pulled already, or timed out"
            " (--pd-hold-timeout-s)"), status=404)
    send_s = await pd.pull(rid, nbytes)
    return web.json_response({"ok": True, "send_s": send_s, "replica_id": settings.replica_id})


async def kv_release(request: web.Request) -> web.Response:
    """``POST /kv/release`` (cluster token; for one ``remote_request_id``, also that hold's own credential, so
    a third-party proxy that gives up can let go of what it asked for): nothing will pull a hold any more (kvemu's router: the decode leg
    ended, answered, failed or its client gone; or the prefill leg did, unread). Body ``{"remote_request_id":
    str}``, or ``{"hold_id": str}``, the name the router gave the leg (``X-Kvemu-Hold-Id``), which also ends a
    leg still queued or computing, and refuses one not arrived yet. Answers 200 ``{"released": bool, "blocks":
    int, "replica_id"}``, released false where nothing was held (the decoder's pull released it, it timed out,
    or it never held anything here)."""
    settings = request.app[SETTINGS]
    obj = await read_body(request)
    pd = request.app[RUNTIME].pd
    rid = obj.get("remote_request_id")
    if obj.get("hold_id") is not None or not isinstance(rid, str) or not pd.may_pull(
            rid, request.headers.get("Authorization", "")):
        require_cluster_token(request, settings.serving.cluster_token)
    if obj.get("hold_id") is not None:  # kvemu's router names its legs: it may not have read the answer
        blocks = pd.release_named(_name(obj.get("hold_id"), "hold_id"))
    else:
        if not isinstance(rid, str) or not rid:
            raise InputError("remote_request_id", f"expected the id a prefill answer's {KV_PARAMS} gave (or"
                                                  f" hold_id: the {HOLD_NAME} of its leg), got {rid!r:.60}")
        blocks = pd.release(rid)
    return web.json_response({"released": blocks is not None, "blocks": blocks or 0,
                              "replica_id": settings.replica_id})


def _name(value, field: str) -> str:
    """A prefill leg's name as kvemu's router gives it (a uuid's hex): it is kept, so it is checked."""
    if not isinstance(value, str) or not 0 < len(value) <= 64 or not value.isascii() or not value.isalnum():
        raise InputError(field, f"expected the {HOLD_NAME} of a prefill leg (up to 64 letters and digits),"
                                f" got {value!r:.60}")
    return value


async def start(request: web.Request, spec: protocol.GenerateSpec, params: KvTransferParams | None,
                submit: Submit) -> Handle | None:
    """Start a generation request: plainly, as the prefill leg of a remote decode, or as the decode leg
    after a remote prefill. None: the client left while its KV was on the way (nothing stays pinned)."""
    if params is None or not (params.do_remote_decode or params.do_remote_prefill):
        return submit(request, spec)
    check_role(request.app[SETTINGS].role, params)
    if params.do_remote_decode:  # vLLM's proxy asks for one token; the decode leg generates the rest
        spec.max_tokens = 1
        return _prefill_leg(request, spec, submit)
    return await _decode_leg(request, spec, params, submit)


def _prefill_leg(request: web.Request, spec: protocol.GenerateSpec, submit: Submit) -> Handle:
    """A prefill whose blocks are held for a remote decode: from a client without the cluster token, only
    within its share of the pool (--pd-hold-share, replica/pd_share.py; a 429 beyond it)."""
    pd = request.app[RUNTIME].pd
    if bearer_ok(request, request.app[SETTINGS].serving.cluster_token):  # kvemu's router: it releases its holds
        name = request.headers.get(HOLD_NAME)
        if name is None:
            return submit(request, spec, hold=True)
        if pd.names.released_already(_name(name, HOLD_NAME)):
            raise InputError(HOLD_NAME, "this prefill leg was released before it arrived (the router gave up on"
                                        " it): nothing will pull what it would hold")
        handle = submit(request, spec, hold=True)
        pd.names.add(name, handle)
        return handle
    shares = pd.shares
    client, blocks = request.remote or "?", len(spec.hashes)
    shares.check(client, blocks)
    handle = submit(request, spec, hold=True)
    shares.add(client, handle.req, blocks)
    return handle


async def _decode_leg(request: web.Request, spec: protocol.GenerateSpec, params: KvTransferParams,
                      submit: Submit) -> Handle | None:
    state = request.app[RUNTIME]
    state.pd.check_peer(params.remote_host or "", params.remote_port or 0, f"{KV_PARAMS}.remote_host")
    keep = state.settings.stored_response_kv == "keep"
    response_hashes = spec.response_hashes if keep else None
    handle = state.pd.engine.reserve(spec.hashes, spec.prompt_tokens, spec.max_tokens, spec.session, spec.stream,
                                     response_hashes)
    if handle is None:  # the pool cannot hold its blocks now: prefill it here instead
        state.pd.failover("no_room")
        return submit(request, spec)
    state.register_blocks(spec.hashes, response_hashes, spec.block_tokens)
    try:
        async with until_client_gone(request):
            why = await state.pd.fetch(handle, params)
    except ClientGone:
        state.pd.engine.cancel_remote(handle)
        return None
    except BaseException:
        state.pd.engine.cancel_remote(handle)
        raise
    if why is None:
        return handle
    state.pd.engine.cancel_remote(handle)
    state.pd.failover(why)
    return submit(request, spec)
