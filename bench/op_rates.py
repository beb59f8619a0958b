"""Operations per second of a callable over a list of items, for the benches.

``bench/`` is on ``sys.path`` when a bench runs as a script, so they import this as ``op_rates``.
"""

from __future__ import annotations

import asyncio
import time


def timed_sync(fn, items, seconds: float) -> float:
    """Operations per second calling ``fn`` on every item in turn, for at least ``seconds``."""
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for it in items:
            fn(it)
        n += len(items)
    return n / (time.perf_counter() - t0)


async def timed_async(fn, items, seconds: float, concurrency: int) -> float:
    """Operations per second with ``concurrency`` workers each awaiting one op at a time."""
    done = 0
    deadline = time.perf_counter() + seconds

    async def worker(k: int) -> None:
        nonlocal done
        i = k
        while time.perf_counter() < deadline:
            await fn(items[i % len(items)])
            i += concurrency
            done += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(k) for k in range(concurrency)))
    return done / (time.perf_counter() - t0)
