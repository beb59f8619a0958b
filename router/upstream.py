"""What a replica's answer can mean to the router, whichever path sent the request (views, pd)."""

from __future__ import annotations

from aiohttp import web

from shared import protocol

MID_STREAM_ERROR = b'data: {"error": {"message": "replica failed mid-stream", "code": 502}}\n\n'


class ReplicaFailed(Exception):
    """The replica did not answer (connection error, timeout, 5xx before any byte)."""


class ReplicaBusy(Exception):
    """The replica answered 503 with Retry-After (its queue or connection cap is full): overload,
    not failure. Try another, keep its index entries, and leave it alone for a while."""


def check_status(status: int, headers) -> None:
    """Raise what a replica's status means for routing: busy (503 + Retry-After) or failed (5xx)."""
    if status == 503 and "Retry-After" in headers:
        raise ReplicaBusy()
    if status >= 500:
        raise ReplicaFailed(f"replica answered {status}")


async def end_stream(resp: web.StreamResponse, metrics, failed: bool) -> web.StreamResponse:
    """End a relayed stream: cleanly, or, when the replica failed mid-stream (too late to retry), with the
    error told to the client in-band rather than a silent end. A client already gone changes nothing."""
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
