"""Replica throughput: /generate requests per second at time_scale 0, JSON vs msgpack,
measured side by side in one run against one replica process, plus the server-side
overhead per request (the handler's wall time from the Server-Timing header), p50/p99.

    python bench/bench_replica.py [--requests 6000] [--concurrency 32] [--blocks 16]

The replica runs as a real process on 127.0.0.1 (pinned to one core with taskset when
available); the client is an aiohttp session in this process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import aiohttp
import msgpack


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_replica(port: int) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "kvemu", "replica", "--port", str(port), "--capacity-blocks", "200000", "--time-scale", "0"]
    if shutil.which("taskset") and os.cpu_count() and os.cpu_count() > 1:
        cmd = ["taskset", "-c", "0", *cmd]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def wait_healthy(url: str) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(200):
            try:
                async with s.get(url + "/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError("replica did not start")


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


async def run_mode(url: str, mode: str, n: int, concurrency: int, blocks: int) -> dict:
    server_ms: list[float] = []
    client_ms: list[float] = []
    counter = iter(range(n))

    def body(i: int) -> tuple[bytes, dict]:
        # every 4th request repeats an earlier prompt: a mix of hits and misses
        base = (i // 4) * 1000 if i % 4 else i * 1000 + 7
        payload = {"block_hashes": [base + k for k in range(blocks)], "max_tokens": 1}
        if mode == "msgpack":
            return msgpack.packb(payload), {"Content-Type": "application/msgpack", "Accept": "application/msgpack"}
        return json.dumps(payload).encode(), {"Content-Type": "application/json"}

    async def worker(session: aiohttp.ClientSession) -> None:
        for i in counter:
            data, headers = body(i)
            t0 = time.perf_counter()
            async with session.post(url + "/generate", data=data, headers=headers) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"status {r.status}")
                timing = r.headers.get("Server-Timing", "")
            client_ms.append((time.perf_counter() - t0) * 1000)
            if "dur=" in timing:
                server_ms.append(float(timing.split("dur=")[1]))

    conn = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=conn) as session:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
        wall = time.perf_counter() - t0
    return {"mode": mode, "requests": n, "requests_per_s": round(n / wall, 1),
            "server_overhead_ms_p50": round(quantile(server_ms, 0.5), 3),
            "server_overhead_ms_p99": round(quantile(server_ms, 0.99), 3),
            "client_latency_ms_p50": round(quantile(client_ms, 0.5), 3),
            "client_latency_ms_p99": round(quantile(client_ms, 0.99), 3)}


async def main_async(args) -> dict:
    port = free_port()
    proc = start_replica(port)
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_healthy(url)
        await run_mode(url, "json", min(500, args.requests), args.concurrency, args.blocks)  # warm-up
        results = []
        for _ in range(args.rounds):  # alternate modes so drift on a shared machine hits both
            for mode in ("json", "msgpack"):
                results.append(await run_mode(url, mode, args.requests, args.concurrency, args.blocks))
    finally:
        proc.terminate()
        proc.wait(10)
    best = {m: max((r for r in results if r["mode"] == m), key=lambda r: r["requests_per_s"])
            for m in ("json", "msgpack")}
    return {"bench": "replica_generate", "blocks_per_prompt": args.blocks, "concurrency": args.concurrency,
            "server_pinned_to_one_core": bool(shutil.which("taskset")), "rounds": results, "best": best,
            "msgpack_over_json": round(best["msgpack"]["requests_per_s"] / best["json"]["requests_per_s"], 3),
            "target_requests_per_s": 2000,
            "target_met": min(b["requests_per_s"] for b in best.values()) >= 2000}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
