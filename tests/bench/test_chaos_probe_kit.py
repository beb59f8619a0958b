"""The instruments of the operator's probes (``bench/chaos.py --scenarios probes``), against real servers on
loopback: how each way a request can end is counted (answered, cleanly refused, lost), and what the listener
of ``ssrf_probe`` records of a connection. The probes themselves start ``kvemu up`` several times (minutes):
they are run by hand, and their figures are in docs/reliability.md."""

import asyncio
import socket
import threading
from collections import Counter

import aiohttp
import pytest
from aiohttp import web

from bench.chaoskit.ssrf import Listener, _normal
from bench.chaoskit.traffic import send, summary


async def _completions(request: web.Request) -> web.StreamResponse:
    mode = (await request.json())["mode"]
    if mode == "json":
        return web.json_response({"choices": [{"text": "hi"}]})
    if mode.startswith("http_"):
        return web.json_response({"error": {"message": "no"}}, status=int(mode[5:]))
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b'data: {"choices": [{"text": "a"}]}\n\n')
    if mode == "stream_done":
        await resp.write(b"data: [DONE]\n\n")
    elif mode == "stream_reset":  # the connection dies mid-stream: no chunked terminator
        assert request.transport is not None
        request.transport.abort()
        return resp
    await resp.write_eof()  # "stream_cut": a clean end, but without [DONE]
    return resp


@pytest.fixture(scope="module")
def server():
    app = web.Application()
    app.router.add_post("/v1/completions", _completions)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}/v1/completions"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_each_end_of_a_request_is_counted_answered_refused_or_lost(server):
    modes = ["json", "stream_done", "stream_cut", "stream_reset", "http_429", "http_503", "http_400", "http_500"]

    async def run():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
            got = [await send(http, server, {"mode": m, "stream": m.startswith("stream")}) for m in modes]
            got.append(await send(http, f"http://127.0.0.1:{_closed_port()}/v1/completions", {"mode": "json"}))
            return got
    got = asyncio.run(run())
    assert got == ["ok", "ok", "cut", "reset", "http_429", "http_503", "http_400", "http_500", "conn_refused"]
    s = summary(Counter(got), [0.001 * k for k in range(1, 10)], sent=10)  # the 10th sent, never ended
    # answered: the JSON and the stream with [DONE]; refused: 429, 503, 400; lost: the rest and the 10th
    assert (s["answered"], s["refused"], s["lost"], s["failed"]) == (2, 3, 5, 7)
    assert s["failed_by_cause"] == {"conn_refused": 1, "cut": 1, "http_400": 1, "http_429": 1, "http_500": 1,
                                    "http_503": 1, "reset": 1}
    assert (s["latency_ms_p50"], s["latency_ms_max"]) == (5.0, 9.0)


def test_the_listener_records_each_connection_and_finds_the_token():
    listener, banner = Listener(), Listener(banner=b"SSH-2.0-x\r\n")
    try:
        body = b'{"remote_request_id": "x"}'
        with socket.create_connection(("127.0.0.1", listener.port)) as s:
            s.sendall(b"POST /kv/pull HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer sekrit-7\r\nContent-Length: %d"
                      b"\r\n\r\n%s" % (len(body), body))
            assert s.recv(100) == b""  # a whole request came: closed with no answer
        with socket.create_connection(("127.0.0.1", banner.port)) as s:
            assert s.recv(100) == b"SSH-2.0-x\r\n"
        assert listener.carrying("sekrit-7") == 1 and listener.carrying("other") == 0
        assert listener.heads() == ["POST /kv/pull HTTP/1.1 | Host | Authorization | Content-Length"]
    finally:
        listener.stop()
        banner.stop()


def test_an_answer_is_compared_without_what_the_probe_put_in_it():
    text = '{"error": {"message": "room 4300 was not prefilled at 127.0.0.1:5123 (answer 404)"}}'
    assert _normal(400, text, 5123, 4300) == "400 room ROOM was not prefilled at 127.0.0.1:PORT (answer 404)"
    assert _normal(200, "{}", 5123, 4300) == "200"
