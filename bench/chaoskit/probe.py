"""The probe scenarios an operator runs against ``kvemu up`` as a user starts it (bench/chaoskit/up.py): hostile
clients that pin or abandon KV, and faults under load (a process SIGKILLed or SIGSTOPped). Each reports sent,
answered, failed by cause, lost (bench/chaoskit/traffic.py) and ``pinned_after``, the KV blocks prefill
replicas still hold for a remote decode once the load is over. ``ssrf_probe`` is in bench/chaoskit/ssrf.py."""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable

import aiohttp

from .cluster import REPO, get_json, wait_until
from .traffic import Traffic, send
from .up import Up, healthy, held

PD = ("--prefill-replicas", "1", "--decode-replicas", "1")
LONG = (300, 600)  # unique tokens after the shared prefix: more than 16 blocks a decoder lacks, so a P/D router
#                    sends the prompt to a prefill instance (the prefix decider's threshold)


def in_up(args: tuple[str, ...], run: Callable[[Up], dict]) -> dict:
    up = Up(*args).start()
    try:
        out = run(up)
        out["up_running_at_end"] = up.running()
        out["up_exit_status_before_stop"] = up.proc.poll() if up.proc is not None else None
    finally:
        up.stop()
    return out


def pinned(up: Up, out: dict) -> dict:
    h = held(up)
    out["pinned_after"], out["pinned_after_per_replica"] = h["held_blocks"], h["per_replica"]
    return out


def at(t0: float, offset: float) -> None:
    time.sleep(max(t0 + offset - time.monotonic(), 0))


def _fire(url: str, bodies: list[dict], timeout: float) -> Counter:
    """``bodies`` POSTed to ``url`` all at once; their outcomes (bench/chaoskit/traffic.py)."""
    async def run() -> Counter:
        conn = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=timeout)) as http:
            return Counter(await asyncio.gather(*(send(http, url, b) for b in bodies)))
    return asyncio.run(run())


def pinning_client(n: int, rate: float, duration: float) -> dict:
    """``n`` prompts of 3,000 unique tokens (188 blocks each; 2,000 blocks fill the prefill replica at 11) sent
    at once straight to the prefill replica with ``{"do_remote_decode": true}`` and no token, their KV never
    pulled; meanwhile ``rate`` requests/s through the router whose prompts go to that prefill replica."""
    rng = random.Random(7)
    bodies = [{"prompt": [rng.randrange(1_000_000, 2_000_000) for _ in range(3000)], "max_tokens": 1,
               "kv_transfer_params": {"do_remote_decode": True}} for _ in range(n)]

    def run(up: Up) -> dict:
        prefill = up.replicas("prefill-")["prefill-0"]
        load = Traffic(up.router, rate, duration, tail=LONG).start()
        pins = _fire(prefill + "/v1/completions", bodies, timeout=duration)
        out = load.join()
        h = held(up)["per_replica"]["prefill-0"]
        out["normal_answered_meanwhile"] = out["answered"] > 0
        out.update({"pinning_sent": n, "pinning_outcomes": dict(sorted(pins.items())),
                    "pinning_refused_429": pins["http_429"], "held_blocks": h["held_blocks"],
                    "capacity_blocks": h["capacity_blocks"],
                    "held_fraction": round((h["held_blocks"] or 0) / h["capacity_blocks"], 3)})
        return pinned(up, out)

    return in_up((*PD, "--capacity-blocks", "2000", "--time-scale", "0.05"), run)


def _kill_at_third(up: Up, url: str, load: Traffic, duration: float) -> dict:
    """SIGKILL what serves ``url`` a third of the way into ``load``; after the load, whether it answers
    /health again (within 10 s)."""
    at(load.t0, duration / 3)
    pid = up.signal(url, signal.SIGKILL)
    out = load.join()
    back = wait_until(lambda: healthy(url), 10.0)
    out.update({"killed_pid": pid, "back_after_load_s": None if back is None else round(back, 2)})
    return out


def store_kill_up(rate: float, duration: float) -> dict:
    """``kvemu up`` with a shared KV store (small HBM, so the replicas use it) under load; the store process
    SIGKILLed at 1/3. Did clients lose anything, is up still running, did the store come back?"""
    def run(up: Up) -> dict:
        load = Traffic(up.router, rate, duration).start()
        out = _kill_at_third(up, up.urls["shared-store"], load, duration)
        out["store_back"] = out["back_after_load_s"] is not None
        out["replica_store_states"] = {rid: _get(url + "/health").get("shared_store")
                                      for rid, url in up.replicas().items()}
        return pinned(up, out)

    return in_up(("--replicas", "2", "--capacity-blocks", "64", "--shared-cache-gib", "1", "--time-scale", "0.05"),
                  run)


def replica_kill_up(rate: float, duration: float) -> dict:
    """Two runs of ``kvemu up`` under load: colocated (2 replicas), replica-0 SIGKILLed at 1/3; P/D (2 prefill,
    1 decode instance, prompts long enough to be prefilled remotely), prefill-0 SIGKILLed at 1/3."""
    def run(victim: str, tail: tuple[int, int]) -> Callable[[Up], dict]:
        def go(up: Up) -> dict:
            out = _kill_at_third(up, up.urls[victim], Traffic(up.router, rate, duration, tail=tail).start(), duration)
            out["killed"] = victim
            return pinned(up, out)
        return go

    colo = in_up(("--replicas", "2", "--capacity-blocks", "4000", "--time-scale", "0.05"),
                  run("replica-0", (16, 160)))
    pd = in_up(("--prefill-replicas", "2", "--decode-replicas", "1", "--capacity-blocks", "4000",
                 "--time-scale", "0.05"), run("prefill-0", LONG))
    out: dict = {k: colo[k] + pd[k] for k in ("sent", "answered", "refused", "failed", "lost")}
    out["pinned_after"] = None if None in (colo["pinned_after"], pd["pinned_after"]) else \
        colo["pinned_after"] + pd["pinned_after"]
    out["failed_by_cause"] = dict(sorted((Counter(colo["failed_by_cause"]) + Counter(pd["failed_by_cause"])).items()))
    out.update({"colocated": colo, "pd": pd})
    return out


def first_byte_flag() -> str | None:
    """The router's first-byte timeout flag as ``kvemu up --help`` names it, if it has one."""
    text = subprocess.run([sys.executable, "-m", "kvemu", "up", "--help"], cwd=REPO, capture_output=True,
                          text=True, timeout=60).stdout
    m = re.search(r"(--[\w-]*first-byte[\w-]*)", text)
    return m.group(1) if m else None


def frozen_replica(rate: float, duration: float, frozen_s: float = 10.0, first_byte_s: float = 2.0) -> dict:
    """SIGSTOP replica-0 of two for ``frozen_s`` (SIGCONT after) from 1/5 of the load through the router (30 s
    client timeout); the router given ``first_byte_s`` as its first-byte timeout where it has the flag. How
    many requests took longer than that timeout + 2 s (with no flag: ``first_byte_s`` + 2 s all the same)?"""
    flag = first_byte_flag()

    def run(up: Up) -> dict:
        load = Traffic(up.router, rate, duration, timeout=30.0).start()
        at(load.t0, duration / 5)
        url = up.urls["replica-0"]
        pid = up.signal(url, signal.SIGSTOP)
        try:
            time.sleep(frozen_s)
        finally:  # never leave a stopped process behind
            if pid is not None:
                os.kill(pid, signal.SIGCONT)
        out = load.join()
        limit = first_byte_s + 2.0
        out.update({"first_byte_flag": flag, "first_byte_s": first_byte_s if flag else None, "frozen_s": frozen_s,
                    "over_limit_s": limit, "over_limit": load.over(limit), "frozen_pid": pid})
        return pinned(up, out)

    extra = (flag, str(first_byte_s)) if flag else ()
    return in_up(("--replicas", "2", "--capacity-blocks", "4000", "--time-scale", "0.05", *extra), run)


def _get(url: str) -> dict:
    try:
        return get_json(url, timeout=2.0)
    except (OSError, ValueError):
        return {}
