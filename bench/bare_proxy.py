"""The baseline of bench/bench_router_cpu.py: a bare aiohttp + uvloop reverse proxy that
forwards every POST to one upstream, with no parsing, no index and no metrics.

    python bench/bare_proxy.py PORT UPSTREAM_URL
"""

from __future__ import annotations

import sys

import aiohttp
import uvloop
from aiohttp import web


def make_app(upstream: str) -> web.Application:
    app = web.Application()

    async def start(app):
        app["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        yield
        await app["session"].close()

    async def forward(request: web.Request) -> web.Response:
        raw = await request.read()
        async with app["session"].post(upstream + request.path, data=raw,
                                       headers={"Content-Type": request.content_type}) as up:
            body = await up.read()
            return web.Response(body=body, status=up.status, content_type=up.content_type)

    app.cleanup_ctx.append(start)
    app.router.add_post("/{tail:.*}", forward)
    app.router.add_get("/health", lambda r: web.json_response({"status": "ok"}))
    return app


if __name__ == "__main__":
    uvloop.install()
    web.run_app(make_app(sys.argv[2]), host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
