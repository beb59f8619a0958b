"""``abandoning_client``: clients of a P/D cluster that close their connection before the answer is whole, and
the KV blocks the prefill replica still holds for a remote decode afterwards (a hold no decode leg will pull
stays pinned until ``--pd-hold-timeout-s``, 480 s by default). Three kinds, in turn:

* ``stream_mid_decode``: streamed, closed 0-1 s after the first token (mid-decode);
* ``plain_mid_decode``: not streamed, closed 0.1-2 s after the prefill's end (mid-decode);
* ``between_legs`` (every other client): not streamed, closed as soon as the prefill replica's public
  ``/stats`` counts one more held prefill (``pd.held_total``, read about every millisecond): when the
  prefill instance holds the KV and the decode leg has not pulled it yet, a window of a few milliseconds
  that a client closing at a fixed time hits now and then, and one watching /stats hits every time.

The prefill's end is measured first: the median of three plain requests of the same length straight to the
prefill replica. Prompts are 2,000 unique tokens at ``--time-scale 10`` (a prefill of about 0.3 s, the 150
tokens of decode about 2.5 s), one client every 0.5 s so no two prefills meet; the plain load (short prompts,
decoded where they land) runs meanwhile."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections import Counter

import aiohttp

from .probe import PD, at, in_up, pinned
from .ssrf import post
from .traffic import Traffic
from .up import Up, held

PROMPT = 2000
KINDS = ("stream_mid_decode", "plain_mid_decode", "between_legs")
ORDER = ("stream_mid_decode", "between_legs", "plain_mid_decode", "between_legs")  # half of them between the legs


async def leave(url: str, body: dict, after_s: float, watch: str = "") -> str:
    """Send ``body`` to ``url`` + /v1/completions on a raw connection and close it ``after_s`` seconds later (a
    streamed one: after its first data chunk), or with ``watch`` (a prefill replica's URL) as soon as it holds
    one more prefill; ``left``, or ``answered`` when the answer ended first."""
    base = await _held_total(watch) if watch else 0
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (host.encode(), len(data), data))
    seen = b""
    try:
        if watch:
            return await _until_held(watch, base, after_s)
        while body.get("stream") and b"data:" not in seen:
            chunk = await asyncio.wait_for(reader.read(65536), 30)
            if not chunk:
                return "answered"
            seen += chunk
        deadline = time.monotonic() + after_s
        while (left := deadline - time.monotonic()) > 0:
            if not await asyncio.wait_for(reader.read(65536), left):
                return "answered"  # the server closed first: the whole answer came
        return "left"
    except TimeoutError:
        return "left"
    finally:
        writer.close()


async def _held_total(url: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(url + "/stats") as resp:
        return int((await resp.json())["pd"]["held_total"])


async def _until_held(url: str, base: int, timeout: float) -> str:
    """Poll ``url``'s /stats until it has held more than ``base`` prefills (``left``: the caller closes at
    once; a non-streamed answer comes only after the decode, long after); ``timeout`` s at most."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            async with http.get(url + "/stats") as resp:
                if int((await resp.json())["pd"]["held_total"]) > base:
                    return "left"
    return "left_unseen"


def _prefill_s(url: str, rng: random.Random) -> float:
    """The median wall seconds of three plain one-token requests of PROMPT tokens straight to a replica."""
    times = [post(url + "/v1/completions", {"prompt": _tokens(rng), "max_tokens": 1})[2] for _ in range(3)]
    return statistics.median(times)


def _tokens(rng: random.Random) -> list[int]:
    return [rng.randrange(1_000_000, 2_000_000) for _ in range(PROMPT)]


def _plan(n: int, prefill_s: float, rng: random.Random) -> list[tuple[str, dict, float]]:
    """(kind, body, seconds before the client leaves) of each of ``n`` clients, in ORDER's turn."""
    out = []
    for i in range(n):
        kind = ORDER[i % len(ORDER)]
        body = {"prompt": _tokens(rng), "max_tokens": 150, "stream": kind == "stream_mid_decode"}
        if kind == "stream_mid_decode":
            after = rng.uniform(0.0, 1.0)
        elif kind == "plain_mid_decode":
            after = prefill_s + rng.uniform(0.1, 2.0)
        else:
            after = prefill_s + 5.0  # the longest it watches /stats
        out.append((kind, body, after))
    return out


def abandoning_client(n: int, rate: float) -> dict:
    rng = random.Random(11)

    def run(up: Up) -> dict:
        prefill = up.replicas("prefill-")["prefill-0"]
        prefill_s = _prefill_s(prefill, rng)
        plan = _plan(n, prefill_s, rng)
        load = Traffic(up.router, rate, 0.5 * n).start()

        async def clients() -> dict:
            tasks = []
            for i, (kind, body, after) in enumerate(plan):
                await asyncio.sleep(max(load.t0 + 0.5 * i - time.monotonic(), 0))
                watch = prefill if kind == "between_legs" else ""
                tasks.append((kind, asyncio.create_task(leave(up.router, body, after, watch))))
            by_kind: dict[str, Counter] = {k: Counter() for k in KINDS}
            for kind, task in tasks:
                by_kind[kind][await task] += 1
            return {k: dict(v) for k, v in by_kind.items()}
        outcomes = asyncio.run(clients())
        out = load.join()
        end = time.monotonic()
        at(end, 2.0)
        at2 = held(up)["held_blocks"]
        at(end, 10.0)
        out.update({"abandoning_clients": n, "abandoning_outcomes": outcomes, "prefill_s": round(prefill_s, 3),
                    "pinned_after_2s": at2})
        return pinned(up, out)  # pinned_after: 10 s after the load

    return in_up((*PD, "--capacity-blocks", "8000", "--time-scale", "10"), run)
