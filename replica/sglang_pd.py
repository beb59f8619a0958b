"""SGLang's P/D wire on kvemu replicas, so that ``sglang-router --pd-disaggregation`` drives them.

sglang-router (and SGLang's mini load balancer) sends the *same* request to a prefill and a decode server
at once, with three fields injected: ``bootstrap_host`` (the prefill server's host), ``bootstrap_port``
(the port given after its URL: ``--prefill URL PORT``) and ``bootstrap_room`` (a random 63-bit id the two
legs share). SGLang's decode server then fetches the room's KV from the prefill server's bootstrap
endpoint once it is computed; the router answers the client with the decode server's answer.

kvemu maps that onto the vLLM-style legs replica/pd.py already runs:

* a **prefill** replica receiving a request with ``bootstrap_room`` runs it as a prefill for a remote
  decode (``do_remote_decode``: one token, its blocks held); once held, the room is bound to the
  ``kv_transfer_params`` its answer carries;
* a **decode** replica receiving one asks ``GET http://{bootstrap_host}:{bootstrap_port}/kv/bootstrap?room=R``
  (the cluster token, presented only where ``bootstrap_host:bootstrap_port`` is one of its ``--pd-peers``: an
  address from a request is never sent a secret; without ``--pd-peers`` it asks no bootstrap), which
  answers those ``kv_transfer_params`` as soon as the prefill replica has held the room (it waits for
  it: the two legs arrive in either order), then runs the decode leg
  with them (the pull over ``/kv/pull``, as after a vLLM proxy's prefill);
* a colocated (``both``) replica ignores the fields and serves the request whole.

The bootstrap port is the prefill replica's own HTTP port (kvemu runs no separate bootstrap server):
give it after the URL, ``--prefill http://host:8101 8101``. A decode leg whose room names no reachable
prefill replica, or that is never held there within the wait, is a 400 naming ``bootstrap_room``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from replica.engine import Handle
from replica.runtime import RUNTIME, SETTINGS
from shared import protocol
from shared.auth import bearer_header, require_cluster_token
from shared.errors import InputError
from shared.protocol import BOOTSTRAP_FIELDS, KV_PARAMS, KvTransferParams, parse_params

HOST, PORT, ROOM = BOOTSTRAP_FIELDS  # SGLang's names: the prefill server's address, the pair's id
BOOTSTRAP_WAIT_S = 60.0  # how long a decode leg waits for its room's prefill (SGLang's bootstrap timeout is 300)
_REQUEST_ROOM = "kvemu_sglang_room"  # where a prefill leg's room rides on its aiohttp request


class Rooms:
    """A prefill replica's rooms: each one's ``kv_transfer_params`` once its prefill is held, awaited by
    the decode leg's bootstrap ask (which may come first). An unclaimed room goes after ``ttl_s``, and the
    hold bound to it with it (``on_unclaimed``: no decoder can learn its parameters any more)."""

    def __init__(self, ttl_s: float = 2 * BOOTSTRAP_WAIT_S,
                 on_unclaimed: Callable[[str], object] | None = None) -> None:
        self.ttl_s = ttl_s
        self.rooms: dict[int, asyncio.Future] = {}
        self.on_unclaimed = on_unclaimed

    def _future(self, room: int) -> asyncio.Future:
        fut = self.rooms.get(room)
        if fut is None:
            loop = asyncio.get_running_loop()
            fut = self.rooms[room] = loop.create_future()
            loop.call_later(self.ttl_s, self._expire, room, fut)
        return fut

    def _expire(self, room: int, fut: asyncio.Future) -> None:
        if self.rooms.get(room) is not fut:  # claimed (and perhaps the room number used again)
            return
        del self.rooms[room]
        if fut.done() and self.on_unclaimed is not None:
            self.on_unclaimed(fut.result()["remote_request_id"])

    def bind(self, room: int, params: dict) -> None:
        fut = self._future(room)
        if not fut.done():
            fut.set_result(params)

    async def claim(self, room: int, timeout_s: float) -> dict | None:
        """The room's parameters once its prefill is held (None: not within ``timeout_s``); claimed once."""
        try:
            params = await asyncio.wait_for(asyncio.shield(self._future(room)), timeout_s)
        except TimeoutError:
            return None
        self.rooms.pop(room, None)
        return params


ROOMS = web.AppKey("sglang_rooms", Rooms)


def _room_fields(obj: dict) -> tuple[int, str | None, int | None] | None:
    room = obj.get(ROOM)
    if room is None:
        return None
    if isinstance(room, bool) or not isinstance(room, int) or not 0 <= room < 2**64:
        raise InputError(ROOM, f"expected an integer in [0, 2**64) (SGLang's batch form, a list, is not emulated),"
                               f" got {room!r:.40}")
    host, port = obj.get(HOST), obj.get(PORT)
    if host is not None and not isinstance(host, str):
        raise InputError(HOST, f"expected a host name, got {host!r:.40}")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536):
        raise InputError(PORT, f"expected a port number, got {port!r:.40}")
    return room, host, port


async def bootstrap_params(request: web.Request, raw: bytes) -> KvTransferParams | None:
    """The leg a request carrying SGLang's bootstrap fields is on this replica (None: a plain request)."""
    if ROOM.encode() not in raw:
        return None
    fields = _room_fields(protocol.decode_body(raw, request.content_type or ""))
    role = request.app[SETTINGS].role
    if fields is None or role == "both":
        return None
    room, host, port = fields
    if role == "prefill":
        request[_REQUEST_ROOM] = room
        return KvTransferParams(do_remote_decode=True)
    if not host or port is None:
        raise InputError(PORT, "a decode replica needs the prefill server's bootstrap_host and"
                               " bootstrap_port (give sglang-router the prefill replica's HTTP port after"
                               " its URL: --prefill URL PORT)")
    params = await _fetch_room(request, host, port, room)
    return parse_params(params)


async def _fetch_room(request: web.Request, host: str, port: int, room: int) -> Any:
    """The room's parameters from its prefill replica's bootstrap endpoint. The cluster token goes only to a
    peer this replica was given (``--pd-peers``), never to an address a request chose; any failure is one
    answer, so the fields cannot probe what listens where."""
    settings = request.app[SETTINGS]
    state = request.app[RUNTIME]
    if settings.pd_peers is None:
        raise InputError(ROOM, "this decode replica asks a bootstrap only of the prefill replicas it was given:"
                               " start it with --pd-peers naming them (HOST:PORT, comma-separated)")
    state.pd.check_peer(host, port, HOST)
    headers = bearer_header(settings.serving.cluster_token)
    session = state.pd.session
    assert session is not None, "the app's pd_ctx opens the session"
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/kv/bootstrap"
    try:
        async with session.get(url, params={"room": str(room)}, headers=headers,
                               timeout=aiohttp.ClientTimeout(total=BOOTSTRAP_WAIT_S + 5)) as resp:
            body = await resp.json(content_type=None) if resp.status == 200 else None
    except (TimeoutError, aiohttp.ClientError, ValueError):
        body = None
    if not isinstance(body, dict) or not isinstance(body.get(KV_PARAMS), dict):
        raise InputError(ROOM, f"room {room} was not prefilled at {host}:{port} within {BOOTSTRAP_WAIT_S:g} s:"
                               " is bootstrap_port that prefill replica's HTTP port, and is it running?")
    return body[KV_PARAMS]


def held(request: web.Request, handle: Handle) -> None:
    """A prefill leg's blocks are held: its room (if it came with one) now names them."""
    room = request.get(_REQUEST_ROOM)
    if room is not None and handle.kv_transfer_params is not None:
        request.app[ROOMS].bind(room, handle.kv_transfer_params)


async def bootstrap(request: web.Request) -> web.Response:
    """``GET /kv/bootstrap?room=R`` (cluster token): the room's ``kv_transfer_params`` once its prefill is
    held here (waits up to ``BOOTSTRAP_WAIT_S``); 404 when it is not."""
    settings = request.app[SETTINGS]
    require_cluster_token(request, settings.serving.cluster_token)
    raw = request.query.get("room", "")
    if not raw.isdigit() or int(raw) >= 2**64:
        raise InputError("room", f"expected the bootstrap_room integer, got {raw!r:.40}")
    params = await request.app[ROOMS].claim(int(raw), BOOTSTRAP_WAIT_S)
    if params is None:
        return web.json_response(protocol.error_body(404, "room", f"room {raw} was not prefilled on replica"
                                                     f" {settings.replica_id} within {BOOTSTRAP_WAIT_S:g} s"), status=404)
    return web.json_response({KV_PARAMS: params, "replica_id": settings.replica_id})


def install(app: web.Application) -> None:
    app[ROOMS] = Rooms(on_unclaimed=lambda rid: app[RUNTIME].pd.release(rid))
    app.router.add_get("/kv/bootstrap", bootstrap)
