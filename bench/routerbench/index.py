"""Index lookups/s and events/s: ``bench/bench_index.py``'s ``run()`` when it can be called,
otherwise a direct measurement of ``MemoryIndex`` / ``RedisIndex`` here."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import sys
import time

from op_rates import timed_async, timed_sync

from .settings import BENCH_DIR

FALLBACK_PROMPT_BLOCKS = 64


async def index_phase(a, redis_url: str | None) -> dict:
    """bench_index.run() when importable and callable; else measure here."""
    ns = argparse.Namespace(seconds=a.index_seconds, concurrency=32, prompts=256,
                            ingest_batches=a.index_ingest_batches)
    try:
        sys.path.insert(0, str(BENCH_DIR))
        import bench_index  # noqa: PLC0415  (optional, maintained separately)

        if not asyncio.iscoroutinefunction(getattr(bench_index, "run", None)):
            raise AttributeError("bench_index has no async run(args)")
        raw = await bench_index.run(ns)
        return {"source": "bench_index.run", **_index_summary(raw), "raw": raw}
    except Exception as exc:  # noqa: BLE001  (a file in progress elsewhere must not sink this bench)
        reason = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(BENCH_DIR))
    out = await index_fallback(a, redis_url)
    return {"source": "bench_router fallback", "bench_index_unusable_because": reason, **out}


def _index_summary(raw: dict) -> dict:
    lk = {row["replicas"]: row for row in raw.get("lookup", [])}
    ing = raw.get("ingest", {})
    row = lk.get(4) or next(iter(lk.values()), {})
    red_conc = next((v for k, v in row.items() if k.startswith("redis_lookup_per_s_") and "_1_" not in k), None)
    return {
        "prompt_blocks": raw.get("prompt_blocks"),
        "lookups_per_s": {"replicas": row.get("replicas"), "memory": row.get("memory_lookup_sync_per_s"),
                          "redis_1_in_flight": row.get("redis_lookup_per_s_1_in_flight"),
                          "redis_32_in_flight": red_conc},
        "events_per_s": {"hashes_per_event": ing.get("hashes_per_batch"),
                         "memory": ing.get("memory_batches_per_s"),
                         "redis_16_streams": ing.get("redis_batches_per_s_16_streams"),
                         "memory_hashes_per_s": ing.get("memory_hashes_per_s"),
                         "redis_hashes_per_s": ing.get("redis_hashes_per_s_16_streams")},
    }


def _fallback_workload(ingest_batches: int):
    """256 prompts of 64 blocks; 4 replicas' stored batches (random prefixes of 128 prompts
    each) to look them up against; ``ingest_batches`` fresh batches from 16 replicas."""
    from shared.index import EventBatch, IndexEvent

    blocks = FALLBACK_PROMPT_BLOCKS
    rng = random.Random(1)
    prompts = [[rng.getrandbits(64) for _ in range(blocks)] for _ in range(256)]
    held = [EventBatch(f"r{r}", "e1", 0, [IndexEvent("stored", tuple(
        h for p in rng.sample(prompts, 128) for h in p[: rng.randint(1, blocks)]))]) for r in range(4)]
    ingest = []
    for i in range(ingest_batches):
        ingest.append(EventBatch(f"i{i % 16}", "e1", i // 16,
                                 [IndexEvent("stored", tuple(rng.getrandbits(64) for _ in range(blocks)))]))
    return prompts, held, ingest


async def index_fallback(a, redis_url: str | None) -> dict:
    from shared.index import MemoryIndex

    prompts, held, ingest = _fallback_workload(a.index_ingest_batches)
    mem = MemoryIndex()
    for b in held:
        mem.apply_sync(b)
    out = {"prompt_blocks": FALLBACK_PROMPT_BLOCKS,
           "lookups_per_s": {"replicas": 4, "memory": round(timed_sync(mem.lookup_sync, prompts, a.index_seconds))}}
    m2 = MemoryIndex()
    t0 = time.perf_counter()
    for b in ingest:
        m2.apply_sync(b)
    out["events_per_s"] = {"hashes_per_event": FALLBACK_PROMPT_BLOCKS,
                           "memory": round(len(ingest) / (time.perf_counter() - t0))}
    if redis_url:
        await _redis_rates(out, redis_url, prompts, held, ingest, a.index_seconds)
    return out


async def _redis_rates(out: dict, redis_url: str, prompts, held, ingest, seconds: float) -> None:
    """Add RedisIndex lookups/s (1 and 32 in flight) and events/s (16 streams) to ``out``."""
    from shared.index import RedisIndex

    red = RedisIndex(redis_url, cluster=f"benchidx{os.getpid()}", pool_size=32)
    red2 = RedisIndex(redis_url, cluster=f"benchidxin{os.getpid()}", pool_size=16)
    try:
        for b in held:
            await red.apply(b)
        out["lookups_per_s"]["redis_1_in_flight"] = round(await timed_async(red.lookup, prompts, seconds, 1))
        out["lookups_per_s"]["redis_32_in_flight"] = round(await timed_async(red.lookup, prompts, seconds, 32))
        streams = [ingest[k::16] for k in range(16)]

        async def stream(bs):
            for b in bs:
                await red2.apply(b)

        t0 = time.perf_counter()
        await asyncio.gather(*(stream(s) for s in streams))
        out["events_per_s"]["redis_16_streams"] = round(len(ingest) / (time.perf_counter() - t0))
    finally:
        await red.clear_replica("r0")
        await red.close()
        await red2.close()
