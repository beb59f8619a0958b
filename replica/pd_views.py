"""HTTP side of disaggregated prefill and decode (replica/pd.py): the pull endpoint a decode instance
calls on a prefill instance, and how a generation request is started in either leg."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from replica.engine import Handle
from replica.pd import KV_PARAMS, KvTransferParams, check_role
from replica.runtime import RUNTIME, SETTINGS
from shared import protocol
from shared.auth import require_cluster_token
from shared.errors import InputError
from shared.httpkit import read_body
from shared.serve import ClientGone, until_client_gone

Submit = Callable[..., Handle]
MAX_PULL_BYTES = 1 << 50


async def kv_pull(request: web.Request) -> web.Response:
    """``POST /kv/pull`` (cluster token): a decode instance reads a held prefill's KV. Body
    ``{"remote_request_id": str, "bytes": int >= 0, "decoder": str}``; answers ``{"ok": true, "send_s":
    emulated seconds on this NIC's send link}`` once sent, the blocks released. 404: not held here
    (never prefilled for a remote decode, pulled already, or timed out)."""
    settings = request.app[SETTINGS]
    require_cluster_token(request, settings.serving.cluster_token, settings.admin_token)
    obj = await read_body(request)
    rid = obj.get("remote_request_id")
    if not isinstance(rid, str) or not rid:
        raise InputError("remote_request_id", f"expected the id a prefill answer's {KV_PARAMS} gave, got {rid!r:.60}")
    nbytes = obj.get("bytes")
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or not 0 <= nbytes <= MAX_PULL_BYTES:
        raise InputError("bytes", f"expected an integer in [0, 2**50], got {nbytes!r:.40}")
    decoder = obj.get("decoder")
    if not isinstance(decoder, str) or not decoder:
        raise InputError("decoder", f"expected the decode instance's id, got {decoder!r:.60}")
    pd = request.app[RUNTIME].pd
    if rid not in pd.held:
        pd.counters.pulls_unknown += 1
        return web.json_response(protocol.error_body(
            404, "remote_request_id", f"remote_request_id: {rid!r:.80} is not held by replica {settings.replica_id}:"
            " it was never prefilled here for a remote decode, was pulled already, or timed out"
            " (--pd-hold-timeout-s)"), status=404)
    send_s = await pd.pull(rid, nbytes)
    return web.json_response({"ok": True, "send_s": send_s, "replica_id": settings.replica_id})


async def start(request: web.Request, spec: protocol.GenerateSpec, params: KvTransferParams | None,
                submit: Submit) -> Handle | None:
    """Start a generation request: plainly, as the prefill leg of a remote decode, or as the decode leg
    after a remote prefill. None: the client left while its KV was on the way (nothing stays pinned)."""
    if params is None or not (params.do_remote_decode or params.do_remote_prefill):
        return submit(request, spec)
    check_role(request.app[SETTINGS].role, params)
    if params.do_remote_decode:  # vLLM's proxy asks for one token; the decode leg generates the rest
        spec.max_tokens = 1
        return submit(request, spec, hold=True)
    return await _decode_leg(request, spec, params, submit)


async def _decode_leg(request: web.Request, spec: protocol.GenerateSpec, params: KvTransferParams,
                      submit: Submit) -> Handle | None:
    state = request.app[RUNTIME]
    keep = state.settings.stored_response_kv == "keep"
    response_hashes = spec.response_hashes if keep else None
    handle = state.engine.reserve(spec.hashes, spec.prompt_tokens, spec.max_tokens, spec.session, spec.stream,
                                  response_hashes)
    if handle is None:  # the pool cannot hold its blocks now: prefill it here instead
        state.pd.failover("no_room")
        return submit(request, spec)
    state.register_blocks(spec.hashes, response_hashes, spec.block_tokens)
    try:
        async with until_client_gone(request):
            why = await state.pd.fetch(handle, params)
    except ClientGone:
        state.engine.cancel_remote(handle)
        return None
    except BaseException:
        state.engine.cancel_remote(handle)
        raise
    if why is None:
        return handle
    state.engine.cancel_remote(handle)
    state.pd.failover(why)
    return submit(request, spec)
