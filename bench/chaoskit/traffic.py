"""The probe scenarios' load (bench/chaoskit/probe.py): an open loop of ``/v1/completions``, every other one
streamed, each request ending in one outcome. What a client can tell apart:

* ``ok``: a 200 whose JSON body came whole, or a stream that ended with ``data: [DONE]``;
* ``http_<code>``: an answer with that status; a 4xx or a 503 is a clean refusal (the client knows it was
  not served and may retry), any other 5xx is not;
* ``cut``: a 200 stream that ended without ``[DONE]`` (or a 200 body that is not whole JSON);
* ``stream_error``: a 200 stream that ended with an error event (the router's word that the replica serving
  it failed mid-stream) and ``[DONE]``: told, but not served, so counted as lost;
* ``reset`` (the connection died mid-request), ``timeout`` (no end within the client's timeout),
  ``conn_refused`` (nothing listening).

``lost`` is every request neither answered nor cleanly refused: sent - ok - (4xx + 503)."""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections import Counter

import aiohttp

PREFIXES = [list(range(p * 10_000, p * 10_000 + 256)) for p in range(8)]  # shared system prompts, 16 blocks


def clean_refusal(outcome: str) -> bool:
    """A 4xx or a 503: the client was told, in an answer, that it was not served."""
    return outcome.startswith("http_4") or outcome == "http_503"


def prompt(i: int, rng: random.Random, tail: tuple[int, int] = (16, 160)) -> list[int]:
    return PREFIXES[i % len(PREFIXES)] + [rng.randrange(1_000_000, 2_000_000) for _ in range(rng.randrange(*tail))]


def summary(outcomes: Counter, latencies: list[float], sent: int) -> dict:
    """The counts every probe scenario reports; latencies (ms) are of every request, whatever its end."""
    ok = outcomes["ok"]
    refused = {k: v for k, v in outcomes.items() if clean_refusal(k)}
    failed = {k: v for k, v in outcomes.items() if k != "ok"}
    lat = sorted(latencies)
    return {"sent": sent, "answered": ok, "refused": sum(refused.values()), "failed": sum(failed.values()),
            "failed_by_cause": dict(sorted(failed.items())), "lost": sent - ok - sum(refused.values()),
            "latency_ms_p50": round(lat[len(lat) // 2] * 1000, 1) if lat else None,
            "latency_ms_p99": round(lat[min(int(len(lat) * 0.99), len(lat) - 1)] * 1000, 1) if lat else None,
            "latency_ms_max": round(lat[-1] * 1000, 1) if lat else None}


async def outcome_of(resp: aiohttp.ClientResponse, stream: bool) -> str:
    """Read an answer to its end: ``ok``, ``cut`` or ``http_<code>`` (module docstring)."""
    if resp.status != 200:
        await resp.read()
        return f"http_{resp.status}"
    if not stream:
        try:
            json.loads(await resp.read())
        except ValueError:
            return "cut"
        return "ok"
    done = error = False
    async for line in resp.content:
        done = done or line.strip() == b"data: [DONE]"
        error = error or line.startswith(b'data: {"error"')
    return "cut" if not done else "stream_error" if error else "ok"


async def send(http: aiohttp.ClientSession, url: str, body: dict) -> str:
    """POST ``body`` to ``url`` and read the answer: its outcome (module docstring)."""
    try:
        async with http.post(url, json=body) as resp:
            return await outcome_of(resp, bool(body.get("stream")))
    except TimeoutError:
        return "timeout"
    except aiohttp.ClientConnectorError:
        return "conn_refused"
    except (aiohttp.ClientError, OSError):
        return "reset"


class Traffic:
    """``rate`` requests/s for ``duration`` s to ``url`` + /v1/completions, each on its schedule (open loop,
    a fresh connection each), in a background thread; ``join()`` gives ``summary()`` and ``over(s)`` counts
    the requests that took longer than ``s`` seconds. ``tail``: the range of unique tokens after the shared
    prefix (16 blocks); past 16 blocks a P/D router sends the prompt to a prefill instance."""

    def __init__(self, url: str, rate: float, duration: float, timeout: float = 10.0, seed: int = 1,
                 max_tokens: tuple[int, int] = (4, 16), tail: tuple[int, int] = (16, 160)) -> None:
        self.url, self.rate, self.duration, self.timeout = url, rate, duration, timeout
        self.rng = random.Random(seed)
        self.max_tokens, self.tail = max_tokens, tail
        self.outcomes: Counter = Counter()
        self.latencies: list[float] = []
        self.sent = 0
        self.t0 = 0.0
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> Traffic:
        self.t0 = time.monotonic()
        self.thread.start()
        return self

    def join(self) -> dict:
        self.thread.join(self.duration + self.timeout + 30)
        return summary(self.outcomes, self.latencies, self.sent)

    def over(self, seconds: float) -> int:
        return sum(1 for x in self.latencies if x > seconds)

    async def _one(self, http: aiohttp.ClientSession, body: dict) -> None:
        t = time.monotonic()
        key = await send(http, self.url + "/v1/completions", body)
        self.outcomes[key] += 1
        self.latencies.append(time.monotonic() - t)

    async def _run(self) -> None:
        conn = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=self.timeout)) as http:
            tasks = set()
            for i in range(int(self.rate * self.duration)):
                delay = self.t0 + i / self.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                body = {"prompt": prompt(i, self.rng, self.tail), "max_tokens": self.rng.randrange(*self.max_tokens),
                        "stream": i % 2 == 1}
                task = asyncio.create_task(self._one(http, body))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                self.sent += 1
            if tasks:
                await asyncio.wait(tasks)
