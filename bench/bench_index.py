"""Prefix index throughput, memory vs Redis side by side in the same run.  Prints JSON.

Lookups of 64-block prompts with 4 and 16 replicas holding random prefixes of a shared
prompt set, and ingestion of ``stored`` batches of 64 hashes.  Runs on uvloop when it is
installed (as the router does).  ``redis_server_us_*`` is Redis's own time per script call
(INFO commandstats), the rest of a Redis call is the client and the loopback.  Redis is a private
redis-server on a free loopback port, started here and stopped at the end.

    python bench/bench_index.py [--seconds 1.0] [--concurrency 32] [--prompts 256]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import socket
import subprocess
import tempfile
import time

import redis
from op_rates import timed_async, timed_sync

from shared.index import EventBatch, IndexEvent, MemoryIndex, RedisIndex

BLOCKS = 64


class PrivateRedis:
    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("redis-server is not on PATH")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.dir = tempfile.mkdtemp(prefix="kvemu-bench-redis-")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port).ping():
                    return
            except redis.ConnectionError:
                time.sleep(0.05)
        self.stop()
        raise SystemExit("private redis-server did not start")

    def version(self) -> str:
        return redis.Redis(port=self.port).info("server")["redis_version"]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def workload(replicas: int, n_prompts: int, rng: random.Random):
    """Prompts, plus per replica one stored batch holding a random prefix of half of them."""
    prompts = [[rng.getrandbits(64) for _ in range(BLOCKS)] for _ in range(n_prompts)]
    batches = []
    for r in range(replicas):
        held = [h for p in rng.sample(prompts, n_prompts // 2) for h in p[: rng.randint(1, BLOCKS)]]
        batches.append(EventBatch(f"r{r}", "e1", 0, [IndexEvent("stored", tuple(held))]))
    return prompts, batches


def server_us_per_call(url: str) -> float:
    """Redis-side time per EVALSHA since the last reset: the server's share of a lookup."""
    stats = redis.Redis.from_url(url).info("commandstats").get("cmdstat_evalsha", {})
    return round(stats.get("usec_per_call", 0.0), 1)


async def bench_lookups(url: str, replicas: int, a, rng) -> dict:
    prompts, batches = workload(replicas, a.prompts, rng)
    mem = MemoryIndex()
    for b in batches:
        mem.apply_sync(b)
    red = RedisIndex(url, cluster=f"lookup{replicas}", pool_size=a.concurrency)
    try:
        for b in batches:
            await red.apply(b)
        for p in prompts:
            assert await red.lookup(p) == mem.lookup_sync(p)
        hits = sum(len(mem.lookup_sync(p)) for p in prompts) / len(prompts)
        out = {
            "replicas": replicas,
            "avg_replicas_matched": round(hits, 2),
            "memory_lookup_sync_per_s": round(timed_sync(mem.lookup_sync, prompts, a.seconds)),
            "memory_lookup_async_per_s": round(await timed_async(mem.lookup, prompts, a.seconds, 1)),
        }
        redis.Redis.from_url(url).config_resetstat()
        out["redis_lookup_per_s_1_in_flight"] = round(await timed_async(red.lookup, prompts, a.seconds, 1))
        out[f"redis_lookup_per_s_{a.concurrency}_in_flight"] = round(
            await timed_async(red.lookup, prompts, a.seconds, a.concurrency))
        out["redis_server_us_per_lookup"] = server_us_per_call(url)
        return out
    finally:
        await red.close()


def ingest_batches(replicas: int, count: int, rng: random.Random) -> list[EventBatch]:
    seqs = [0] * replicas
    out = []
    for i in range(count):
        r = i % replicas
        hashes = tuple(rng.getrandbits(64) for _ in range(BLOCKS))
        out.append(EventBatch(f"r{r}", "e1", seqs[r], [IndexEvent("stored", hashes)]))
        seqs[r] += 1
    return out


async def bench_ingest(url: str, a, rng) -> dict:
    replicas = 16
    batches = ingest_batches(replicas, a.ingest_batches, rng)
    mem = MemoryIndex()
    t0 = time.perf_counter()
    for b in batches:
        mem.apply_sync(b)
    mem_rate = len(batches) / (time.perf_counter() - t0)
    wire = [b.to_wire() for b in batches]
    t0 = time.perf_counter()
    for w in wire:
        EventBatch.from_wire(w)
    decode_rate = len(wire) / (time.perf_counter() - t0)
    red = RedisIndex(url, cluster="ingest", pool_size=replicas)
    try:
        per_replica = [batches[r::replicas] for r in range(replicas)]

        async def stream(bs):  # one in-order stream per replica, as replicas send them
            for b in bs:
                await red.apply(b)

        redis.Redis.from_url(url).config_resetstat()
        t0 = time.perf_counter()
        await asyncio.gather(*(stream(bs) for bs in per_replica))
        red_rate = len(batches) / (time.perf_counter() - t0)
        server_side = server_us_per_call(url)
        assert (await red.stats())["entries"] == mem.stats_sync()["entries"]
    finally:
        await red.close()
    return {
        "replicas": replicas,
        "batches": len(batches),
        "hashes_per_batch": BLOCKS,
        "memory_batches_per_s": round(mem_rate),
        "memory_hashes_per_s": round(mem_rate * BLOCKS),
        "redis_batches_per_s_16_streams": round(red_rate),
        "redis_hashes_per_s_16_streams": round(red_rate * BLOCKS),
        "redis_server_us_per_batch": server_side,
        "wire_decode_batches_per_s": round(decode_rate),
    }


async def run(a) -> dict:
    rng = random.Random(0)
    server = PrivateRedis()
    try:
        out = {"bench": "prefix_index", "python": platform.python_version(), "redis": server.version(),
               "event_loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
               "cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2),
               "prompt_blocks": BLOCKS, "seconds_per_measure": a.seconds,
               "lookup": [await bench_lookups(server.url, r, a, rng) for r in (4, 16)],
               "ingest": await bench_ingest(server.url, a, rng)}
    finally:
        server.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--ingest-batches", type=int, default=4000)
    a = ap.parse_args()
    try:  # the router runs on uvloop; measure what it will see
        import uvloop
        result = uvloop.run(run(a))
    except ImportError:
        result = asyncio.run(run(a))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
