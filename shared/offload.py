"""Parsing and hashing big request bodies off the event loop.

A 1M-token prompt takes about 0.3-0.5 s of CPU to decode, tokenize and hash; done on the
event loop it stalls every other client (issue 17: six in flight pushed /health from 1 ms
to 1.3 s). Bodies of at least ``threshold`` bytes go to a small process pool (threads would
not help: the decoder and tokenizer hold the GIL); the loop only copies bytes in and a
list of hashes out. Each client address may have at most ``per_client`` big bodies in the
pool at once, and the pool at most ``max_pending``; beyond either the client gets 429 with
Retry-After, naming the body. Small bodies, the common case, are parsed inline.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from aiohttp import web

from shared import protocol
from shared.errors import InputError, UnknownNameError


@dataclass(frozen=True, slots=True)
class OffloadSettings:
    workers: int = 1  # processes; 0 parses every body inline
    threshold: int = 256 * 1024  # bodies of at least this many bytes go to the pool
    per_client: int = 2  # big bodies one client address may have in the pool at once
    max_pending: int = 16  # big bodies in the pool at once, all clients together


def parse_request(path: str, raw: bytes, content_type: str, block_size: int, limits: tuple[int, int],
                  session: str | None):
    """Decode and parse a body for ``path``: a GenerateSpec, or ("error", field, message) (a worker
    process returns errors as values: InputError does not survive pickling)."""
    try:
        obj = protocol.decode_body(raw, content_type)
        if path == "/generate":
            return protocol.parse_generate(obj, block_size, limits, session)
        return protocol.parse_openai(obj, path.endswith("/chat/completions"), block_size, limits, session)
    except InputError as exc:
        return ("error", exc.field, exc.message)
    except UnknownNameError as exc:
        return ("error", exc.kind, str(exc))


class Offloader:
    def __init__(self, settings: OffloadSettings) -> None:
        self.settings = settings
        self.pool: ProcessPoolExecutor | None = None
        self.by_client: dict[str, int] = {}
        self.pending = 0
        self.offloaded = 0
        self.refused = 0

    def _pool(self) -> ProcessPoolExecutor:
        """Started at the first big body (most processes never see one)."""
        if self.pool is None:
            ctx = multiprocessing.get_context("spawn")  # never fork a process running an event loop
            self.pool = ProcessPoolExecutor(self.settings.workers, mp_context=ctx)
        return self.pool

    async def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)

    async def parse(self, request: web.Request, raw: bytes, block_size: int, limits: tuple[int, int]):
        args = (request.path, raw, request.content_type or "", block_size, limits, request.headers.get("X-Session-Id"))
        if self.settings.workers == 0 or len(raw) < self.settings.threshold:
            out = parse_request(*args)
        else:
            out = await self._in_pool(request.remote or "?", args)
        if isinstance(out, tuple):
            raise InputError(out[1], out[2])
        return out

    async def _in_pool(self, client: str, args):
        s = self.settings
        mine = self.by_client.get(client, 0)
        if mine >= s.per_client or self.pending >= s.max_pending:
            self.refused += 1
            who = "this client has" if mine >= s.per_client else "the server has"
            raise web.HTTPTooManyRequests(reason=f"body: {who} too many large bodies being parsed; retry shortly",
                                          headers={"Retry-After": "1"})
        self.by_client[client] = mine + 1
        self.pending += 1
        self.offloaded += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool(), parse_request, *args)
        finally:
            self.pending -= 1
            left = self.by_client[client] - 1
            if left:
                self.by_client[client] = left
            else:
                del self.by_client[client]


OFFLOAD = web.AppKey("offload", Offloader)


async def offload_ctx(app: web.Application):
    yield
    await app[OFFLOAD].close()
