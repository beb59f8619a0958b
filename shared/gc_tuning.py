"""Settings of Python's cyclic garbage collector for kvemu's long-running loops.

kvemu's processes build a large, long-lived heap (a trace of millions of block ids, an app,
its settings) and then make short-lived objects by the hundred per request. With the default
thresholds every 700 allocations start a collection, and the oldest generation, which holds that
whole heap, is traversed again and again while finding nothing to free (kvemu makes no cycles
on its hot paths). Freezing what exists and collecting the youngest generation every 10,000
allocations keeps the collector for what it is for.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 10_000


def settle_gc() -> None:
    """Once a server has started: what start-up built is never collected again, and the youngest
    generation is collected every 10,000 allocations. This cut the router's collector time from
    about 14 to 4 us per routed request (bench/bench_router_cpu.py)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 10, 10)


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic collector off meanwhile, as before afterwards: for building a heap that has no
    cycles (a trace: its millions of fresh lists would run full collections that free nothing) and
    for one long computation over it (the simulator, which makes no reference cycles per request:
    its cycles, a pool and its policy, a tier stack's closures, are built once before the loop;
    tests/sim/test_gc_free.py checks that runs of different lengths leave the same cyclic garbage).
    6-8 % of a default ``kvemu sim`` of the 20x Mooncake trace against freezing the trace and
    collecting the youngest generation every 10,000 allocations."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
