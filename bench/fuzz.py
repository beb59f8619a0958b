"""Fuzzed bodies against a real router and its replica on 127.0.0.1.  Prints JSON.

For each endpoint family (``/generate``, ``/v1/completions``, ``/v1/chat/completions``)
``--bodies`` random bodies go to the router and, separately, straight to the replica:
objects built from the fields the endpoints read, filled with random values of every JSON
type (nulls, wrong types, huge and negative numbers, deep nesting, non-string text parts),
half as JSON and half as msgpack, plus raw random bytes. Counts of answers by status; the
promise is zero 5xx, and the processes still healthy at the end.

    .venv/bin/python bench/fuzz.py [--bodies 100000] [--concurrency 16] [--seed 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import aiohttp
import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.chaoskit.cluster import REPO, free_port, get_json  # noqa: E402

KEYS = ["token_ids", "block_hashes", "max_tokens", "max_completion_tokens", "input_tokens", "output_tokens",
        "prompt", "messages", "stream", "stream_options", "user", "model", "session"]
FAMILIES = ["/generate", "/v1/completions", "/v1/chat/completions"]


def value(rng: random.Random, depth: int = 0):
    r = rng.random()
    if depth > 3 or r < 0.45:
        return rng.choice([None, True, False, 0, -1, 1, 2**64, -(2**70), 3.5, float("nan"), "", "x" * 300,
                           rng.randrange(-5, 70000), "hello world", "\udcff"[:0] + "é"])
    if r < 0.6:
        return [value(rng, depth + 1) for _ in range(rng.randrange(0, 5))]
    if r < 0.7:
        return {rng.choice(KEYS + ["text", "role", "content", "type"]): value(rng, depth + 1)
                for _ in range(rng.randrange(0, 4))}
    if r < 0.8:
        return [{"role": rng.choice(["user", "system", "tool", "x", None]),
                 "content": rng.choice(["hi", None, 5, [{"type": "text", "text": value(rng, depth + 1)}],
                                        [value(rng, depth + 1)]])} for _ in range(rng.randrange(0, 3))]
    if r < 0.9:
        return [rng.randrange(0, 2**32) for _ in range(rng.randrange(0, 64))]
    n = rng.randrange(100, 3000)
    return json.loads("[" * n + "]" * n) if n < 900 else "[" * n  # deep nesting (as raw text beyond)


def body(rng: random.Random) -> tuple[bytes, str]:
    if rng.random() < 0.03:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64))), "application/json"
    if rng.random() < 0.02:
        return b"[" * rng.choice([1000, 100_000]), "application/json"
    obj = {rng.choice(KEYS): value(rng) for _ in range(rng.randrange(0, 6))}
    if rng.random() < 0.5:
        try:
            return msgpack.packb(obj), "application/msgpack"
        except (OverflowError, TypeError, ValueError):
            return b"\xc1", "application/msgpack"
    return json.dumps(obj, allow_nan=True).encode(), "application/json"


async def fire(url: str, n: int, concurrency: int, seed: int) -> Counter:
    rng = random.Random(seed)
    counts: Counter = Counter()
    samples: list = []
    todo = iter(range(n))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency),
                                     timeout=aiohttp.ClientTimeout(total=30)) as http:
        async def worker():
            for _ in todo:
                raw, ctype = body(rng)
                try:
                    async with http.post(url, data=raw, headers={"Content-Type": ctype}) as resp:
                        data = await resp.read()
                        counts[str(resp.status)] += 1
                        if resp.status >= 500 and len(samples) < 5:
                            samples.append((raw[:200].decode(errors="replace"), data[:200].decode(errors="replace")))
                except (TimeoutError, aiohttp.ClientError) as exc:
                    counts[type(exc).__name__] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    if samples:
        counts["5xx_samples"] = samples  # type: ignore[assignment]
    return counts


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bodies", type=int, default=100_000, help="per endpoint family and target")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    rport, kport = free_port(), free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "kvemu", "replica", "--port", str(rport), "--capacity-blocks", "20000",
                               "--time-scale", "0"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    procs.append(subprocess.Popen([sys.executable, "-m", "kvemu", "router", "--port", str(kport), "--replicas",
                                   f"http://127.0.0.1:{rport}"], cwd=REPO, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL))
    targets = {"router": f"http://127.0.0.1:{kport}", "replica": f"http://127.0.0.1:{rport}"}
    out: dict = {"bodies_per_family": a.bodies, "results": {}}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if get_json(targets["router"] + "/health", timeout=1).get("healthy_replicas") == 1:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("cluster did not start")
            time.sleep(0.2)
        for name, base in targets.items():
            for k, path in enumerate(FAMILIES):
                t = time.monotonic()
                counts = asyncio.run(fire(base + path, a.bodies, a.concurrency, a.seed * 100 + k))
                out["results"][f"{name} {path}"] = {**counts, "wall_s": round(time.monotonic() - t, 1)}
        out["healthy_after"] = {n: get_json(u + "/health").get("status") == "ok" for n, u in targets.items()}
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(20)
    out["total_5xx"] = sum(v for r in out["results"].values() for k, v in r.items() if k[:1] == "5" and k[1:].isdigit())
    print(json.dumps(out, indent=1))
    return 1 if out["total_5xx"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
