"""Load generation: the prompts, open-loop (paced) and closed-loop (as fast as answered) clients."""

from __future__ import annotations

import asyncio
import json
import random
import time

import aiohttp

from .report import quantile
from .settings import BLOCKS, N_PREFIXES, REQUEST_TIMEOUT_S, SHARED_PREFIX_BLOCKS


class Prompts:
    """16-block prompts: a 12-block prefix from a pool of 256 shared ones + 4 fresh blocks,
    so the index finds partial prefixes on some replicas and the caches keep growing."""

    def __init__(self, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.prefixes = [[rng.getrandbits(63) for _ in range(SHARED_PREFIX_BLOCKS)] for _ in range(N_PREFIXES)]
        self.rng = rng
        self.next_unique = 1 << 62

    def body(self) -> bytes:
        prefix = self.prefixes[self.rng.randrange(N_PREFIXES)]
        tail = range(self.next_unique, self.next_unique + BLOCKS - SHARED_PREFIX_BLOCKS)
        self.next_unique += BLOCKS - SHARED_PREFIX_BLOCKS
        return json.dumps({"block_hashes": [*prefix, *tail], "max_tokens": 1}, separators=(",", ":")).encode()


HEADERS = {"Content-Type": "application/json"}


async def post(session: aiohttp.ClientSession, url: str, data: bytes) -> int:
    async with session.post(url, data=data, headers=HEADERS) as r:
        await r.read()
        return r.status


async def open_loop(session: aiohttp.ClientSession, urls: list[str], prompts: Prompts, rate: float,
                    n: int) -> dict:
    """``n`` requests launched every 1/rate s regardless of answers; latency from send to body."""
    loop = asyncio.get_running_loop()
    lat: list[float] = []
    lag: list[float] = []
    errors: dict[str, int] = {}
    pending: set[asyncio.Task] = set()
    max_in_flight = 0

    async def one(url: str, data: bytes) -> None:
        t0 = time.perf_counter()
        try:
            status = await post(session, url, data)
        except (TimeoutError, aiohttp.ClientError) as exc:
            errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            return
        if status != 200:
            errors[str(status)] = errors.get(str(status), 0) + 1
            return
        lat.append((time.perf_counter() - t0) * 1000)

    bodies = [prompts.body() for _ in range(n)]  # built before the clock starts
    start = loop.time() + 0.02
    t_begin = time.perf_counter()
    for i in range(n):
        target = start + i / rate
        delay = target - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        lag.append(max(0.0, loop.time() - target) * 1000)
        task = asyncio.create_task(one(urls[i % len(urls)], bodies[i]))
        pending.add(task)
        task.add_done_callback(pending.discard)
        max_in_flight = max(max_in_flight, len(pending))
    if pending:
        await asyncio.gather(*pending)
    wall = time.perf_counter() - t_begin
    return {"lat": lat, "errors": errors, "achieved_rate": n / wall, "lag_p99": quantile(lag, 0.99),
            "max_in_flight": max_in_flight, "wall": wall}


async def closed_loop(session: aiohttp.ClientSession, urls: list[str], prompts: Prompts, concurrency: int,
                      seconds: float) -> dict:
    done = 0
    errors: dict[str, int] = {}
    bodies = [prompts.body() for _ in range(4096)]
    deadline = time.perf_counter() + seconds

    async def worker(k: int) -> None:
        nonlocal done
        i = k
        while time.perf_counter() < deadline:
            try:
                status = str(await post(session, urls[i % len(urls)], bodies[i % len(bodies)]))
            except (TimeoutError, aiohttp.ClientError) as exc:
                status = type(exc).__name__
            if status == "200":
                done += 1
            else:
                errors[status] = errors.get(status, 0) + 1
            i += concurrency

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    wall = time.perf_counter() - t0
    return {"requests": done, "errors": errors, "wall": wall, "rps": done / wall}


def new_session(limit: int = 0) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=limit, keepalive_timeout=60),
                                 timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S), auto_decompress=False)

