"""The whole measurement: start both clusters, run the rounds, the index phase, then report."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil

from .cluster import Cluster, PrivateRedis
from .index import index_phase
from .load import Prompts, new_session
from .phases import run_rounds
from .procs import Procs
from .report import build_result, profile_top, run_config
from .settings import REPLICAS, log


def start_clusters(procs: Procs, layout: dict, profile_dir: Path | None) -> tuple[PrivateRedis, dict[str, Cluster]]:
    """Start redis-server and both clusters (not yet ready); Redis counts as the redis cluster's."""
    redis = PrivateRedis(procs, layout["redis"])
    clusters = {"memory": Cluster("memory", procs, layout, None, profile_dir),
                "redis": Cluster("redis", procs, layout, redis.url, profile_dir)}
    clusters["redis"].extra.append(redis.proc)
    clusters["redis"].ps_redis.append(psutil.Process(redis.proc.pid))
    return redis, clusters


async def wait_all_ready(redis: PrivateRedis, clusters: dict[str, Cluster]) -> str:
    """Wait for Redis and every replica and router; returns Redis's version."""
    async with new_session() as s:
        redis_version = await redis.wait()
        for cl in clusters.values():
            await cl.wait_ready(s)
    return redis_version


def stop_profiled_routers(clusters: dict[str, Cluster], procs: Procs) -> dict:
    """Stop the routers so cProfile writes its stats, then read their top functions."""
    for cl in clusters.values():
        os.kill(cl.router_proc.pid, signal.SIGCONT)
        procs.stop([cl.router_proc], timeout=30)
    return {m: profile_top(cl.profile_path) for m, cl in clusters.items()}


async def main_async(a, procs: Procs, layout: dict, thr_layout: dict, profile_dir: Path | None) -> dict:
    t_start = time.perf_counter()
    load0 = os.getloadavg()[0]
    redis, clusters = start_clusters(procs, layout, profile_dir)
    prompts = Prompts()
    log(f"started redis-server and 2 x ({REPLICAS} replicas + router); logs in {procs.logdir}")
    redis_version = await wait_all_ready(redis, clusters)
    startup_s = time.perf_counter() - t_start
    log(f"all healthy after {startup_s:.1f}s")
    rounds = await run_rounds(clusters, procs, layout, thr_layout, prompts, a)
    os.kill(redis.proc.pid, signal.SIGCONT)  # the fallback index measurement uses it; clusters stay frozen
    log("index lookups and ingestion (clusters frozen)")
    index = await index_phase(a, redis.url)
    log(f"index done ({index['source']})")
    elapsed_measure = time.perf_counter() - t_start
    profile = stop_profiled_routers(clusters, procs) if profile_dir else None
    config = run_config(a, layout, thr_layout, bool(profile_dir), redis_version, load0)
    timing_s = {"startup": round(startup_s, 1), "startup_and_measure": round(elapsed_measure, 1)}
    return build_result(config, rounds, index, timing_s, profile)
