"""A pipelined RESP connection for the router's hot path (prefix lookups).

redis-py takes a pooled connection per command and wraps hiredis in Python; for a lookup
that Redis answers in ~70 us, that client work was most of the round trip. Here many
lookups share one TCP connection: each writes its command and awaits a future, and one
reader task feeds replies through hiredis and resolves the futures in order (Redis answers
a connection's commands in the order it received them). A caller that gives up (timeout)
leaves its future cancelled; its reply is still read and dropped, so order is never lost.
"""

from __future__ import annotations

import asyncio
from collections import deque
from urllib.parse import unquote, urlsplit

import hiredis


class ReplyError(Exception):
    """Redis answered with an error (e.g. NOSCRIPT)."""


def pack(*args: bytes | str | int) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


def supports(url: str) -> bool:
    """Plain TCP redis:// URLs; TLS and unix sockets stay on redis-py."""
    return urlsplit(url).scheme == "redis"


class PipelinedConnection:
    def __init__(self, url: str, connect_timeout: float = 2.0) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 6379
        self.password = unquote(parts.password) if parts.password else None
        self.username = unquote(parts.username) if parts.username else None
        self.db = int(parts.path.strip("/") or 0)
        self.connect_timeout = connect_timeout
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._pending: deque[asyncio.Future] = deque()
        self._lock = asyncio.Lock()

    def _usable(self) -> bool:
        return self._writer is not None and not self._writer.is_closing() and self._reader_task is not None \
            and not self._reader_task.done()

    async def call(self, *args) -> object:
        if not self._usable():
            await self._connect()
        fut = asyncio.get_running_loop().create_future()
        self._pending.append(fut)
        assert self._writer is not None  # _connect() set it or raised
        self._writer.write(pack(*args))
        return await fut

    async def _connect(self) -> None:
        async with self._lock:
            if self._usable():
                return
            self._drop()
            reader, writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port),
                                                    self.connect_timeout)
            pending: deque[asyncio.Future] = deque()
            # Set all three together: a cancel between them would leave a writer nobody reads for.
            self._writer, self._pending = writer, pending
            self._reader_task = asyncio.create_task(self._read_loop(reader, pending))
        if self.password:
            auth = (self.username, self.password) if self.username else (self.password,)
            await self.call("AUTH", *auth)
        if self.db:
            await self.call("SELECT", self.db)

    async def _read_loop(self, reader: asyncio.StreamReader, pending: deque) -> None:
        parser = hiredis.Reader()
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    raise ConnectionError("connection closed by the server")
                parser.feed(data)
                while (reply := parser.gets()) is not False:
                    fut = pending.popleft()
                    if fut.done():
                        continue  # its caller timed out; the reply is read and dropped
                    if isinstance(reply, hiredis.ReplyError):
                        fut.set_exception(ReplyError(str(reply)))
                    else:
                        fut.set_result(reply)
        except (OSError, ConnectionError, hiredis.ProtocolError, IndexError) as exc:
            _fail(pending, exc)
        except asyncio.CancelledError:
            _fail(pending, ConnectionError("connection closed"))
            raise

    def _drop(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = None
        if self._reader_task is not None and not self._reader_task.done():
            self._reader_task.cancel()
        self._reader_task = None

    async def close(self) -> None:
        task = self._reader_task
        self._drop()
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)


def _fail(pending: deque, exc: BaseException) -> None:
    while pending:
        fut = pending.popleft()
        if not fut.done():
            fut.set_exception(ConnectionError(str(exc) or type(exc).__name__))
