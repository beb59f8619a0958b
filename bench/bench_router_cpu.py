"""Router CPU per routed request next to a bare aiohttp + uvloop proxy, in one run.  Prints JSON.

One replica (``--time-scale 0``) on 127.0.0.1; in front of it, in turn, the kvemu router
(cache_aware, embedded index) and ``bench/bare_proxy.py``.  Each gets the same closed loop
of ``--requests`` /generate requests (token ids: 64 shared + 64 unique, ``max_tokens`` 1)
from ``--concurrency`` keep-alive connections, in ``--rounds`` alternating rounds so drift
on a shared machine hits both; the proxy's CPU time (user + system, from /proc) over the
round divided by the requests is its cost per request.  ``ratio`` = router / bare.
With ``--pd`` the router fronts a P/D cluster instead: one prefill and one decode replica, ``--pd-decider
always``, so each request is its two legs (a prefill, its hold released, then the decode); the bare proxy
still makes one hop, to the decode replica.

    .venv/bin/python bench/bench_router_cpu.py [--requests 3000] [--rounds 3] [--concurrency 16] [--pd]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.chaoskit.cluster import REPO, free_port, get_json  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        rest = fh.read().rsplit(")", 1)[1].split()
    return (int(rest[11]) + int(rest[12])) / TICK


def spawn(args: list[str], port: int):
    import subprocess

    proc = subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if get_json(f"http://127.0.0.1:{port}/health").get("status") == "ok":
                return proc
        except (OSError, ValueError):
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"{args} did not start")


async def closed_loop(url: str, n: int, concurrency: int, offset: int) -> float:
    shared = list(range(64))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as http:
        counter = iter(range(n))

        async def worker():
            for i in counter:
                body = {"token_ids": shared + list(range(10_000 + (offset + i) * 64, 10_064 + (offset + i) * 64)),
                        "max_tokens": 1}
                async with http.post(url + "/generate", json=body) as resp:
                    await resp.read()
                    assert resp.status == 200, resp.status

        t = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.monotonic() - t


def start_replicas(pd: bool) -> tuple[list, str]:
    """The replicas (``--time-scale 0``) and the router's ``--replicas``: one replica, or (``pd``) a prefill and a
    decode replica, the decode one last."""
    roles = ("prefill", "decode") if pd else ("both",)
    procs, urls = [], []
    for role in roles:
        port = free_port()
        procs.append(spawn(["-m", "kvemu", "replica", "--port", str(port), "--capacity-blocks", "200000", "--time-scale", "0",
                            "--role", role], port))
        urls.append(f"{role}=http://127.0.0.1:{port}" if pd else f"http://127.0.0.1:{port}")
    return procs, ",".join(urls)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--pd", action="store_true", help="the router in front of a prefill and a decode replica")
    a = p.parse_args()
    kport, bport = free_port(), free_port()
    replicas, routed = start_replicas(a.pd)
    rurl = routed.rpartition("=")[2]  # the decode replica's (--pd) or the one replica's URL
    router = ["-m", "kvemu", "router", "--port", str(kport), "--replicas", routed, *(("--pd-decider", "always") if a.pd else ())]
    procs = {"router": spawn(router, kport), "bare": spawn(["bench/bare_proxy.py", str(bport), rurl], bport)}
    urls = {"router": f"http://127.0.0.1:{kport}", "bare": f"http://127.0.0.1:{bport}"}
    totals = {k: {"cpu_s": 0.0, "wall_s": 0.0, "requests": 0} for k in procs}
    try:
        for name in procs:  # warm-up
            asyncio.run(closed_loop(urls[name], 200, a.concurrency, 10**6 + (name == "bare") * 10**5))
        for r in range(a.rounds):
            for name in (("router", "bare") if r % 2 == 0 else ("bare", "router")):
                c0 = cpu_s(procs[name].pid)
                wall = asyncio.run(closed_loop(urls[name], a.requests, a.concurrency, (r * 2 + (name == "bare")) * a.requests))
                totals[name]["cpu_s"] += cpu_s(procs[name].pid) - c0
                totals[name]["wall_s"] += wall
                totals[name]["requests"] += a.requests
    finally:
        for proc in (*procs.values(), *replicas):
            proc.terminate()
            proc.wait(20)
    per = {k: {"cpu_us_per_req": round(v["cpu_s"] / v["requests"] * 1e6, 1),
               "req_per_s": round(v["requests"] / v["wall_s"], 1), **v} for k, v in totals.items()}
    out: dict[str, object] = {**per, "pd": a.pd,
                              "ratio_router_over_bare": round(per["router"]["cpu_us_per_req"] / per["bare"]["cpu_us_per_req"], 2)}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
