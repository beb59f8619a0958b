"""Serving an aiohttp app the way both processes need it: a socket bound up front (a port in
use is one error line, ``SO_REUSEPORT`` lets several router workers share a port), and a
guard in front of every connection that a slow or greedy client cannot outlast.

The guard wraps aiohttp's protocol: it refuses connections beyond ``max_connections``
(a 503 written straight to the socket), unless the newcomer's address holds fewer than
``max_connections_per_client`` and another holds more: then that other address's oldest
connection without a request in progress makes room (``ConnGuard.make_room``). It closes a connection whose request head has not
arrived within ``header_timeout_s`` of it opening or of its previous response, and cuts
one whose client stops reading: when the transport's buffer has stayed above its
high-water mark (the transport paused the writer) for ``write_timeout_s``, the
connection is aborted, so the handler's pending write fails and its coroutine ends
instead of waiting forever (a stream stuck behind a client that does not read holds its
replica's stream and memory). Costs nothing while clients read: the timer is armed only
while writing is paused. Bodies get their own deadline in ``httpkit.read_raw``.

A request head aiohttp's parser refuses (a negative Content-Length, a malformed line) is
answered with the same JSON error as every other 4xx, naming the header (``_JsonErrors``).

aiohttp does not cancel a handler whose client disconnects (``handler_cancellation`` is off, as
it is by default): a handler that waits (for a replica's answer, for an emulated request to
finish) wraps the wait in ``until_client_gone``, which the guard ends when the connection goes.
"""

from __future__ import annotations

import asyncio
import errno
import socket
from dataclasses import dataclass

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from shared.errors import InputError, KvemuError
from shared.gc_tuning import settle_gc
from shared.protocol import error_body

_REFUSAL_BODY = (b'{"error":{"message":"too many open connections; retry shortly","type":"server_error",'
                 b'"param":null,"code":503}}')
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_REFUSAL_BODY), _REFUSAL_BODY))


@dataclass(frozen=True, slots=True)
class ConnLimits:
    max_connections: int = 1024
    header_timeout_s: float = 10.0  # the request head must arrive within this
    body_timeout_s: float = 30.0  # the whole body must arrive within this (httpkit.read_raw)
    write_timeout_s: float = 30.0  # a client that keeps the send buffer full (reads nothing) this long is cut off
    # Once max_connections are open, an address holding fewer than this may take a connection
    # from the address holding the most, if that one holds more (ConnGuard.make_room).
    max_connections_per_client: int = 256


class _Guarded(asyncio.Protocol):
    """One connection: delegates to aiohttp's handler, with a deadline for each request head."""

    __slots__ = ("guard", "inner", "transport", "client", "timer", "refused", "idle", "busy", "write_timer", "lost")

    def __init__(self, guard: ConnGuard, inner) -> None:
        self.guard, self.inner = guard, inner
        self.transport = None
        self.client = ""  # the peer's address (no port): what the per-client share counts
        self.timer: asyncio.TimerHandle | None = None
        self.refused = False
        self.idle = False  # between requests: the next byte starts the next head's deadline
        self.busy = False  # a handler is running for one of its requests (guard_middleware)
        self.write_timer: asyncio.TimerHandle | None = None  # armed while the transport has paused writing
        self.lost: asyncio.Future | None = None  # done when the connection goes (made when asked for)

    def connection_made(self, transport) -> None:
        self.transport = transport
        g = self.guard
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if isinstance(peer, tuple) and peer else "local"
        if len(g.open) >= g.limits.max_connections and not g.make_room(self.client):
            self.refused = True
            g.refused += 1
            g.count_cut(self.client)
            transport.write(_REFUSAL)
            transport.close()
            return
        g.add(self)
        self.arm()
        self.inner.connection_made(transport)

    def arm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = asyncio.get_running_loop().call_later(self.guard.limits.header_timeout_s, self._too_slow)

    def disarm(self, idle: bool = False) -> None:
        self.idle = idle
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _too_slow(self) -> None:
        self.guard.timed_out += 1
        if self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.idle:  # an idle keep-alive connection is aiohttp's to close (keepalive_timeout)
            self.idle = False
            self.arm()
        if not self.refused:
            self.inner.data_received(data)

    def eof_received(self):
        return None if self.refused else self.inner.eof_received()

    def connection_lost(self, exc) -> None:
        self.disarm()
        self._stop_write_timer()
        if self.refused:
            return
        self.guard.remove(self)
        self.inner.connection_lost(exc)
        if self.lost is not None and not self.lost.done():
            self.lost.set_result(None)

    def shed(self) -> None:
        """Close this connection to make room for another address's (``ConnGuard.make_room``)."""
        self.guard.remove(self)  # at once: the next newcomer must not pick it again before it is gone
        assert self.transport is not None  # it is open: make_room found it among them
        if not self.idle:  # it is sending a head (or has yet to): that request gets the refusal as its answer
            self.transport.write(_REFUSAL)
        self.transport.close()  # an idle keep-alive connection is just closed, as its keep-alive timeout would

    def lost_future(self) -> asyncio.Future:
        """A future done when this connection is lost (the client closed it, or it was cut)."""
        if self.lost is None:
            self.lost = asyncio.get_running_loop().create_future()
        return self.lost

    def pause_writing(self) -> None:
        if self.refused:
            return
        if self.write_timer is None:
            loop = asyncio.get_running_loop()
            self.write_timer = loop.call_later(self.guard.limits.write_timeout_s, self._reads_too_slowly)
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.refused:
            return
        self._stop_write_timer()
        self.inner.resume_writing()

    def _stop_write_timer(self) -> None:
        if self.write_timer is not None:
            self.write_timer.cancel()
            self.write_timer = None

    def _reads_too_slowly(self) -> None:
        self.write_timer = None
        self.guard.write_timed_out += 1
        if self.transport is not None:
            self.transport.abort()  # the handler's pending write raises; nothing else waits on it


_CLIENTS_COUNTED = 64  # addresses the per-client count names; later ones are counted as "other"


class ConnGuard:
    """Open connections of one server, and counters a /metrics or a test can read."""

    def __init__(self, limits: ConnLimits) -> None:
        self.limits = limits
        self.open: dict = {}  # transport -> _Guarded
        self.clients: dict[str, dict] = {}  # address -> its open connections (transport -> _Guarded), oldest first
        self.refused = 0
        self.shed = 0  # connections closed to make room for another address (make_room)
        self.timed_out = 0
        self.write_timed_out = 0
        self.cut_by_client: dict[str, int] = {}  # address -> its connections refused or shed (bounded)

    def factory(self, server):
        def connection() -> _Guarded:
            inner = server()
            if type(inner) is RequestHandler:  # aiohttp offers no way to give the server another class
                inner.__class__ = _JsonErrors
            return _Guarded(self, inner)
        return connection

    def add(self, conn: _Guarded) -> None:
        self.open[conn.transport] = conn
        self.clients.setdefault(conn.client, {})[conn.transport] = conn

    def remove(self, conn: _Guarded) -> None:
        if self.open.pop(conn.transport, None) is None:
            return  # shed already
        mine = self.clients[conn.client]
        del mine[conn.transport]
        if not mine:
            del self.clients[conn.client]

    def make_room(self, client: str) -> bool:
        """The cap is reached and ``client`` connects: if it holds fewer than its share and the
        address holding the most holds more, close that address's oldest connection without a
        request in progress (True). Below the cap nobody is refused, so one address (a router's
        pool to a replica, a load generator on loopback) may use all of it; at the cap, one
        address's idle connections cannot lock every other address out. Work in progress is
        never cut for it: an address whose surplus connections all have requests running keeps them."""
        share = self.limits.max_connections_per_client
        if len(self.clients.get(client, ())) >= share:
            return False
        most = max(self.clients.values(), key=len, default={})
        if len(most) <= share:
            return False
        victim = next((conn for conn in most.values() if not conn.busy), None)
        if victim is None:
            return False
        self.shed += 1
        self.count_cut(victim.client)
        victim.shed()
        return True

    def count_cut(self, client: str) -> None:
        key = client if client in self.cut_by_client or len(self.cut_by_client) < _CLIENTS_COUNTED else "other"
        self.cut_by_client[key] = self.cut_by_client.get(key, 0) + 1

    def stats(self) -> dict:
        return {"open": len(self.open), "clients": len(self.clients), "refused": self.refused, "shed": self.shed,
                "timed_out": self.timed_out, "write_timed_out": self.write_timed_out,
                "max_connections": self.limits.max_connections,
                "max_connections_per_client": self.limits.max_connections_per_client,
                "cut_by_client": dict(self.cut_by_client)}


class GuardCollector:
    """A guard's counts on a Prometheus registry: connections cut, by reason, and those open."""

    def __init__(self, guard: ConnGuard, prefix: str) -> None:
        self.guard, self.prefix = guard, prefix

    def describe(self):
        return []

    def collect(self):
        g = self.guard
        cut = CounterMetricFamily(f"{self.prefix}connections_cut", "Client connections the server cut: request head"
                                  " too slow, client not reading its response, over the connection cap, or closed at the cap for"
                                  " another address (its address held more than its share).",
                                  labels=["reason"])
        for reason, n in (("head_timeout", g.timed_out), ("write_timeout", g.write_timed_out), ("over_cap", g.refused),
                          ("over_client_share", g.shed)):
            cut.add_metric([reason], n)
        yield cut
        by_client = CounterMetricFamily(f"{self.prefix}connections_cut_by_client", "Connections refused at the"
                                        " connection cap or closed to make room for another address, by client"
                                        f" address (the first {_CLIENTS_COUNTED}; later ones as other).",
                                        labels=["client"])
        for client, n in g.cut_by_client.items():
            by_client.add_metric([client], n)
        yield by_client
        yield GaugeMetricFamily(f"{self.prefix}open_connections", "Open client connections.", value=len(g.open))


GUARD = web.AppKey("conn_guard", ConnGuard)


class ClientGone(Exception):
    """The client's connection went before its answer was ready (``until_client_gone``)."""


class until_client_gone:  # noqa: N801 - used as a context manager, like asyncio.timeout
    """``async with until_client_gone(request):`` the block is cancelled as soon as the request's
    connection is lost, and ``ClientGone`` raised in its place (a cancellation from elsewhere
    still propagates as one). As ``asyncio.timeout``: no extra task, nothing per wait. A guarded
    connection (``serve``) says when it goes; any other (a plain aiohttp site) is looked at
    every ``poll_s`` (aiohttp's TestServer cancels handlers on disconnect itself)."""

    __slots__ = ("request", "poll_s", "_task", "_lost", "_timer", "_state")

    def __init__(self, request: web.BaseRequest, poll_s: float = 0.5) -> None:
        self.request, self.poll_s = request, poll_s
        self._task: asyncio.Task | None = None
        self._lost: asyncio.Future | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._state = "new"  # -> "in" -> ("fired" ->) "out"

    async def __aenter__(self) -> until_client_gone:
        transport = self.request.transport
        if transport is None or transport.is_closing():
            raise ClientGone()
        self._task = asyncio.current_task()
        guard = self.request.app.get(GUARD) if isinstance(self.request, web.Request) else None
        conn = guard.open.get(transport) if guard is not None else None
        self._state = "in"
        if conn is not None:
            self._lost = conn.lost_future()
            self._lost.add_done_callback(self._fire)
        else:
            self._timer = asyncio.get_running_loop().call_later(self.poll_s, self._poll)
        return self

    def _poll(self) -> None:
        transport = self.request.transport
        if transport is None or transport.is_closing():
            self._fire()
        elif self._state == "in":
            self._timer = asyncio.get_running_loop().call_later(self.poll_s, self._poll)

    def _fire(self, _fut: asyncio.Future | None = None) -> None:
        if self._state == "in" and self._task is not None:
            self._state = "fired"
            self._task.cancel()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if self._lost is not None:
            self._lost.remove_done_callback(self._fire)
        if self._timer is not None:
            self._timer.cancel()
        fired, self._state = self._state == "fired", "out"
        if fired and self._task is not None and self._task.uncancel() == 0 and exc_type is asyncio.CancelledError:
            raise ClientGone() from exc


@web.middleware
async def guard_middleware(request: web.Request, handler):
    """The request head is in: stop its deadline; start the next one when the answer is out."""
    conn = request.app[GUARD].open.get(request.transport)
    if conn is not None:
        conn.disarm()
        conn.busy = True  # make_room never closes it while its request runs
    status = 500
    try:
        resp = await handler(request)
        status = resp.status
        return resp
    finally:
        if conn is not None:
            conn.busy = False
            conn.disarm(idle=True)
            if status == 408:  # a body too slow: close once the answer is out, do not linger for the rest
                asyncio.get_running_loop().call_later(0.1, conn.transport.close)


class _JsonErrors(RequestHandler):
    """aiohttp's handler, whose answer to a head its parser refuses (a negative or non-numeric
    Content-Length, a malformed request line or header) is the project's JSON error naming the
    header, not aiohttp's plain text, and logged without a traceback (a client's mistake)."""

    __slots__ = ()

    def handle_error(self, request, status=500, exc=None, message=None):
        if status >= 500 or request.writer.output_size > 0:  # a bug, or an answer begun: aiohttp's own way
            return super().handle_error(request, status, exc, message)
        first = str(message or exc or "").strip().split("\n", 1)[0].strip().rstrip(":")[:200]
        field = next((h for h in _HEAD_FIELDS if h.lower() in first.lower()), None)
        if field == "Content-Length":
            text = f"Content-Length: must be the body's size in bytes, a decimal integer of 0 or more ({first})"
        else:
            text = f"{field or 'request'}: malformed HTTP/1.1 request head ({first}); send a well-formed one"
        resp = web.json_response(error_body(status, field, text), status=status)
        resp.force_close()  # the parser cannot find the next request after a bad head
        return resp


_HEAD_FIELDS = ("Content-Length", "Transfer-Encoding", "Content-Type", "Host")


class _GuardedSite(web.BaseSite):
    def __init__(self, runner: web.AppRunner, sock: socket.socket, guard: ConnGuard) -> None:
        super().__init__(runner)
        self._sock, self._guard = sock, guard

    @property
    def name(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._guard.factory(self._runner.server), sock=self._sock,
                                                backlog=1024)


def bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket; a port in use (without ``reuse_port`` on both sides) is an InputError."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise InputError("host", f"cannot resolve {host!r}: {exc.strerror}") from None
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(addr)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise KvemuError(f"port {port} on {host} is in use; pick another with --port, or stop what"
                             " listens there") from None
        raise InputError("host", f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


def install(app: web.Application, limits: ConnLimits) -> ConnGuard:
    """Give ``app`` a guard (call before ``serve``; ``make_app`` does it so tests see one too)."""
    guard = ConnGuard(limits)
    app[GUARD] = guard
    return guard


def serve(app: web.Application, sock: socket.socket, shutdown_timeout: float = 30.0) -> None:
    """Run ``app`` on ``sock`` until SIGINT/SIGTERM, then shut down gracefully (as ``web.run_app``)."""
    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    runner = web.AppRunner(app, handle_signals=True, access_log=None, shutdown_timeout=shutdown_timeout)

    async def start() -> None:
        await runner.setup()
        await _GuardedSite(runner, sock, app[GUARD]).start()
        settle_gc()

    try:
        loop.run_until_complete(start())
        loop.run_forever()
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        loop.run_until_complete(runner.cleanup())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
