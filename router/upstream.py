"""What a replica's answer can mean to the router, whichever path sent the request (views, pd), and how an
exchange with a replica is watched (``Watch``) and a relayed stream passed on and ended (``pass_stream``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import aiohttp
from aiohttp import web

from shared import protocol
from shared.http_server import ClientGone

# A stream cut by its replica ends as OpenAI's API ends a failed stream: an error event (the SDKs raise it as
# an APIError) and then [DONE], so a client that reads to [DONE] stops rather than waits for more.
MID_STREAM_ERROR = (b"data: " + json.dumps(protocol.error_body(
    502, None, "the replica serving this stream failed before it ended; the answer is incomplete: send the request"
               " again"), separators=(",", ":")).encode() + b"\n\ndata: [DONE]\n\n")


class ReplicaFailed(Exception):
    """The replica did not answer (connection error, timeout, 5xx before any byte)."""


class ReplicaBusy(Exception):
    """The replica answered 503 with Retry-After (its queue or connection cap is full): overload,
    not failure. Try another, keep its index entries, and leave it alone for a while."""


class UpstreamRefused(Exception):
    """A replica answered 4xx to a leg whose answer the router reads (a P/D prefill): the request itself is
    wrong; the client gets the answer as it is."""

    def __init__(self, status: int, body: bytes, content_type: str) -> None:
        super().__init__(status)
        self.status, self.body, self.content_type = status, body, content_type


def check_status(status: int, headers) -> None:
    """Raise what a replica's status means for routing: busy (503 + Retry-After) or failed (5xx)."""
    if status == 503 and "Retry-After" in headers:
        raise ReplicaBusy()
    if status >= 500:
        raise ReplicaFailed(f"replica answered {status}")


class Watch:
    """``async with watch:`` around a wait on a replica (its answer's head; a stream's next bytes). After
    ``after_s`` seconds without progress (``progress()``), the replica is asked whether it is alive: one the
    health checks took out, or that does not answer ``/health`` (``Cluster.probe``, one probe per replica at a
    time), has the wait cut and ``ReplicaFailed`` raised in its place; one that answers is waited for again,
    for as long as it keeps answering. A long answer at the replica's pace never trips it; a frozen replica
    holds a request for at most ``after_s`` plus one health timeout. As ``shared.http_server.until_client_gone``:
    no extra task, one timer per wait. Reusable: the head, then a stream's body."""

    __slots__ = ("_loop", "_state", "_task", "_timer", "after_s", "cluster", "last", "rep")

    def __init__(self, cluster, rep, after_s: float) -> None:
        self.cluster, self.rep, self.after_s = cluster, rep, after_s
        self.last = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._state = "new"  # -> "in" -> ("fired" ->) "out"

    async def __aenter__(self) -> Watch:
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.current_task()
        self.last = self._loop.time()
        self._state = "in"
        self._timer = self._loop.call_at(self.last + self.after_s, self._tick)
        return self

    def progress(self) -> None:
        """The replica sent something: the next check is ``after_s`` from now."""
        assert self._loop is not None
        self.last = self._loop.time()

    def _tick(self) -> None:
        assert self._loop is not None
        if self._state != "in":
            return
        due = self.last + self.after_s
        if self._loop.time() < due:  # it made progress since: wait from then
            self._timer = self._loop.call_at(due, self._tick)
        elif not self.rep.state.healthy:  # the health checks took it out meanwhile
            self._fire()
        else:
            self.cluster.probe(self.rep).add_done_callback(self._probed)

    def _probed(self, probe: asyncio.Future) -> None:
        if self._state != "in":
            return
        if probe.cancelled() or probe.exception() is not None or not probe.result():
            self._fire()
            return
        self.progress()  # alive, only slow: another ``after_s``
        self._timer = self._loop.call_at(self.last + self.after_s, self._tick)  # type: ignore[union-attr]

    def _fire(self) -> None:
        if self._task is not None:
            self._state = "fired"
            self._task.cancel()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        if self._timer is not None:
            self._timer.cancel()
        fired, self._state = self._state == "fired", "out"
        if fired and self._task is not None and self._task.uncancel() == 0 and exc_type is asyncio.CancelledError:
            raise ReplicaFailed(f"nothing for {self.after_s:g} s and no answer to /health") from exc


def failure(exc: BaseException) -> ReplicaFailed:
    """A failed exchange as the retry loops take it (a watch's cut is one already)."""
    return exc if isinstance(exc, ReplicaFailed) else ReplicaFailed(f"{type(exc).__name__}: {exc}")


async def pass_stream(request: web.Request, upstream: aiohttp.ClientResponse, headers: dict, metrics, watch: Watch,
                      rewrite: Callable[[bytes], bytes] | None = None) -> web.StreamResponse:
    """The replica's stream as it comes, passed on in whole events (``rewrite``: each event changed on the way,
    without its blank line), so a cut never leaves half an event before the error event (``end_stream``)."""
    resp = web.StreamResponse(status=upstream.status, headers={**headers, "Cache-Control": "no-cache"})
    await resp.prepare(request)
    pending = b""
    try:
        async with watch:
            async for chunk in upstream.content.iter_any():
                watch.progress()
                data = pending + chunk if pending else chunk
                end = data.rfind(b"\n\n") + 2  # 1: no event ends in it yet
                if end < 2:
                    pending = data
                    continue
                out, pending = data[:end], data[end:]
                if rewrite is not None:
                    out = b"".join(rewrite(e) + b"\n\n" for e in out.split(b"\n\n")[:-1])
                try:
                    await resp.write(out)
                except ConnectionResetError:  # the client hung up: leaving closes the replica's stream
                    raise ClientGone() from None
    except (TimeoutError, aiohttp.ClientError, ReplicaFailed):
        return await end_stream(resp, metrics, failed=True)
    if pending:  # a stream whose last event lacks its blank line: passed on as it came
        await resp.write(pending)
    return await end_stream(resp, metrics, failed=False)


async def end_stream(resp: web.StreamResponse, metrics, failed: bool) -> web.StreamResponse:
    """End a relayed stream: cleanly, or, when the replica failed mid-stream (too late to retry), with an
    error event and ``[DONE]`` (``MID_STREAM_ERROR``) rather than a silent end. A client already gone changes
    nothing."""
    metrics.outcome("failed_mid_stream" if failed else "ok")
    try:
        if failed:
            await resp.write(MID_STREAM_ERROR)
        await resp.write_eof()
    except ConnectionResetError:
        pass
    return resp


def no_replica_answer(metrics, busy: int, failures: int, which: str = "") -> web.Response:
    """Every replica a request could go to was busy or failed: 503 with Retry-After, counted by cause."""
    metrics.outcome("busy" if busy and not failures else "unavailable")
    body = protocol.error_body(503, None, f"no healthy {which}replica could take the request; retry shortly")
    return web.json_response(body, status=503, headers={"Retry-After": "1"})
