"""HTTP plumbing shared by replica and router: JSON errors naming the field, body
parsing (JSON or msgpack) under a size limit, msgpack-or-JSON responses, server timing."""

from __future__ import annotations

import asyncio
import json
import time

import msgpack
from aiohttp import web

from shared import protocol
from shared.errors import InputError, KvemuError, UnknownNameError
from shared.http_server import GUARD

BODY_LIMIT = web.AppKey("body_limit", int)
REJECTIONS = web.AppKey("rejections", dict)  # field -> count of 4xx answers naming it


# ---- middleware: every error is JSON naming the field; nothing escapes as a crash ------
@web.middleware
async def timing_middleware(request: web.Request, handler):
    """Server-Timing header: wall time spent in the handler (the server-side overhead)."""
    start = time.perf_counter()
    resp = await handler(request)
    if not resp.prepared:  # streamed responses have sent their headers already
        resp.headers["Server-Timing"] = f"handler;dur={(time.perf_counter() - start) * 1000:.3f}"
    return resp


@web.middleware
async def errors_middleware(request: web.Request, handler):
    try:
        return await handler(request)
    except InputError as exc:
        rejections = request.app.get(REJECTIONS)
        if rejections is not None:
            key = exc.field.split("[")[0][:64]
            if len(rejections) < 256 or key in rejections:  # bounded: field names come from clients
                rejections[key] = rejections.get(key, 0) + 1
        # "the limit": read_raw's size refusals (a bare "limit" is in "malformed JSON (Expecting ',' delimiter)")
        # (an InputError subclass may carry its own status: a client over a per-client share gets 429)
        status = 413 if exc.field == "body" and "the limit" in exc.message else getattr(exc, "status", 400)
        return web.json_response(protocol.error_body(status, exc.field, str(exc)), status=status)
    except UnknownNameError as exc:
        return web.json_response(protocol.error_body(400, exc.kind, str(exc)), status=400)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        field = "body" if exc.status in (408, 413, 429) else "Content-Type" if exc.status == 415 else None
        kept = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "www-authenticate", "retry-after")}
        resp = web.json_response(protocol.error_body(exc.status, field, exc.reason or str(exc)), status=exc.status,
                                 headers=kept)
        if exc.status == 408:
            resp.force_close()  # the rest of a slow body is not worth waiting for
        return resp
    except KvemuError as exc:
        return web.json_response(protocol.error_body(503, None, str(exc)), status=503, headers={"Retry-After": "1"})


# Media types read as a body, beside a missing Content-Type (read as JSON, as always). Form-encoded is
# what `curl -d` and Python's urllib send when not told: read as JSON, like a missing type. Octet-stream
# is what aiohttp's client sends for bytes given no type (the router forwards a body without one so).
_BODY_TYPES = frozenset({"application/json", protocol.MSGPACK, "application/x-msgpack",
                         "application/x-www-form-urlencoded", "application/octet-stream"})


def check_content_type(request: web.Request) -> None:
    """A body sent as something else (text/plain, a multipart form, XML) is a 415 naming the header
    (vLLM's and SGLang's FastAPI servers refuse it too, with a 422), not text parsed as JSON by chance."""
    if "Content-Type" not in request.headers:
        return
    kind = request.content_type  # lower case, parameters (charset) dropped
    if kind in _BODY_TYPES or (kind.startswith("application/") and kind.endswith("+json")):
        return
    raise web.HTTPUnsupportedMediaType(reason=f"Content-Type: {kind[:60]!r} bodies are not read; send Content-Type:"
                                              f" application/json (or {protocol.MSGPACK})")


async def read_raw(request: web.Request) -> bytes:
    """The request body under the app's size limit (a router forwards these bytes as they are)."""
    check_content_type(request)
    limit = request.app[BODY_LIMIT]
    if request.content_length is not None and request.content_length > limit:
        raise InputError("body", f"is {request.content_length} bytes; the limit is {limit}")
    guard = request.app.get(GUARD)
    if request.content.is_eof():  # all of it arrived with the head (most requests): no deadline to arm
        return await request.read()
    deadline = None if guard is None else guard.limits.body_timeout_s
    try:
        async with asyncio.timeout(deadline):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise InputError("body", f"exceeds the limit of {limit} bytes") from None
    except TimeoutError:
        raise web.HTTPRequestTimeout(reason=f"body: not received within {deadline:g} s") from None


async def read_body(request: web.Request) -> dict:
    return protocol.decode_body(await read_raw(request), request.content_type or "")


def query_int(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    """An integer query parameter within ``[lo, hi]`` (``default`` when absent), else a 400 naming it."""
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise InputError(name, f"expected an integer, got {raw!r:.40}") from None
    if not lo <= value <= hi:
        raise InputError(name, f"must be between {lo} and {hi}")
    return value


def wants_msgpack(request: web.Request) -> bool:
    accept = request.headers.get("Accept", "")
    return protocol.MSGPACK in accept or (request.content_type == protocol.MSGPACK and "json" not in accept)


def respond(request: web.Request, body: dict, status: int = 200) -> web.Response:
    if wants_msgpack(request):
        return web.Response(body=msgpack.packb(body), status=status, content_type=protocol.MSGPACK)
    return web.Response(text=json.dumps(body, separators=(",", ":")), status=status, content_type="application/json")


