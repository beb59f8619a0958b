"""``shared.http_server.until_client_gone`` in-process: a handler's wait ends with ``ClientGone`` when
its client disconnects, on a guarded connection (as ``serve`` runs the processes) and on aiohttp's
plain server (looked at every ``poll_s``); a wait that ends first, or a cancellation from
elsewhere, is left as it is."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from shared import http_server
from shared.http_server import ClientGone, ConnLimits, until_client_gone


def app_recording(outcomes: list, release: asyncio.Event) -> web.Application:
    async def wait(request: web.Request) -> web.Response:
        t0 = time.monotonic()
        try:
            async with until_client_gone(request, poll_s=0.05):
                await release.wait()
            outcomes.append(("done", time.monotonic() - t0))
            return web.Response(text="done")
        except ClientGone:
            outcomes.append(("gone", time.monotonic() - t0))
            return web.Response(status=499)
        except asyncio.CancelledError:
            outcomes.append(("cancelled", time.monotonic() - t0))
            raise

    app = web.Application()
    http_server.install(app, ConnLimits())
    app.router.add_get("/wait", wait)
    return app


async def leave_after(port: int, seconds: float) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /wait HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    await asyncio.sleep(seconds)
    writer.close()
    await writer.wait_closed()


async def until(pred, timeout: float = 2.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def test_a_guarded_connection_ends_the_wait_as_soon_as_the_client_goes():
    async def go():
        outcomes: list = []
        app = app_recording(outcomes, asyncio.Event())
        runner = web.AppRunner(app)
        await runner.setup()
        sock = http_server.bind("127.0.0.1", 0)
        site = http_server._GuardedSite(runner, sock, app[http_server.GUARD])
        await site.start()
        try:
            await leave_after(sock.getsockname()[1], 0.2)
            await until(lambda: outcomes)
        finally:
            await runner.cleanup()
        return outcomes

    outcomes = asyncio.run(go())
    assert [o for o, _ in outcomes] == ["gone"] and 0.2 <= outcomes[0][1] < 0.3, outcomes


def test_an_unguarded_connection_is_polled_and_a_wait_that_ends_first_is_untouched():
    """A plain aiohttp site (no guard; handler_cancellation off, as in ``serve``: aiohttp's own
    TestServer turns it on, and would cancel the handler itself)."""
    async def go():
        outcomes: list = []
        release = asyncio.Event()
        runner = web.AppRunner(app_recording(outcomes, release))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            await leave_after(port, 0.1)
            await until(lambda: outcomes)
            release.set()  # the next wait ends by itself
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /wait HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = await reader.read()
            writer.close()
            await asyncio.sleep(0.2)  # no late cancel from a timer
        finally:
            await runner.cleanup()
        return outcomes, answer

    outcomes, answer = asyncio.run(go())
    assert [o for o, _ in outcomes] == ["gone", "done"] and 0.1 <= outcomes[0][1] < 0.3, outcomes
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"done")


def test_a_cancellation_from_elsewhere_is_not_taken_for_a_client_that_left():
    class Req:  # what until_client_gone reads of a request
        transport = None

    async def go():
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0))
        req = Req()
        req.transport = transport

        async def waiter():
            async with until_client_gone(req, poll_s=0.05):  # type: ignore[arg-type]
                await asyncio.sleep(10)

        task = asyncio.create_task(waiter())
        await asyncio.sleep(0.05)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            return "cancelled"
        finally:
            transport.close()
        return "not cancelled"

    assert asyncio.run(go()) == "cancelled"
