"""An open-loop load at a fixed rate (each request leaves on its schedule, answered or not),
run in a background thread; every request ends in one outcome: ok, http_<status>,
timeout, reset (the connection died mid-request) or refused (nothing listening)."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter

import aiohttp

PREFIXES = [list(range(p * 10_000, p * 10_000 + 256)) for p in range(8)]  # shared system prompts, 16 blocks


def body(i: int, rng: random.Random) -> dict:
    tail = [rng.randrange(1_000_000, 2_000_000) for _ in range(rng.randrange(16, 160))]
    return {"token_ids": PREFIXES[i % len(PREFIXES)] + tail, "max_tokens": rng.randrange(2, 12)}


class OpenLoop:
    def __init__(self, url: str, rate: float, duration: float, timeout: float = 10.0, seed: int = 1) -> None:
        self.url, self.rate, self.duration, self.timeout = url, rate, duration, timeout
        self.rng = random.Random(seed)
        self.outcomes: Counter = Counter()
        self.latencies: list[float] = []
        self.sent = 0
        self.thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> OpenLoop:
        self.t0 = time.monotonic()
        self.thread.start()
        return self

    def join(self) -> dict:
        self.thread.join(self.duration + self.timeout + 30)
        lat = sorted(self.latencies)
        answered = sum(v for k, v in self.outcomes.items() if k.startswith("ok") or k.startswith("http_"))
        failed = {k: v for k, v in self.outcomes.items() if k != "ok"}
        return {"sent": self.sent, "answered": answered, "ok": self.outcomes["ok"], "failed": sum(failed.values()),
                "failed_by_cause": dict(sorted(failed.items())),
                "latency_ms_p50": round(lat[len(lat) // 2] * 1000, 1) if lat else None,
                "latency_ms_p99": round(lat[int(len(lat) * 0.99)] * 1000, 1) if lat else None}

    async def _one(self, http: aiohttp.ClientSession, payload: dict) -> None:
        t = time.monotonic()
        try:
            async with http.post(self.url + "/generate", json=payload) as resp:
                await resp.read()
                key = "ok" if resp.status == 200 else f"http_{resp.status}"
        except TimeoutError:
            key = "timeout"
        except aiohttp.ClientConnectorError:
            key = "refused"
        except (aiohttp.ClientError, OSError):
            key = "reset"
        self.outcomes[key] += 1
        if key == "ok":
            self.latencies.append(time.monotonic() - t)

    async def _run(self) -> None:
        # A fresh connection per request: a killed router worker then costs only what it was serving.
        conn = aiohttp.TCPConnector(limit=0, force_close=True)
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as http:
            tasks = set()
            n = int(self.rate * self.duration)
            for i in range(n):
                delay = self.t0 + i / self.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(self._one(http, body(i, self.rng)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                self.sent += 1
            if tasks:
                await asyncio.wait(tasks)
