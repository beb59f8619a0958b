"""The simulator runs with the cyclic collector off (shared.gc_tuning.gc_paused): that is safe only
while a run makes no reference cycles per request, which these runs check."""

import gc

import pytest

from loadgen.formats import read_trace
from loadgen.trace import Trace
from sim.run import simulate
from sim.simulator import SimSettings


def cyclic_garbage_after(trace: Trace, settings: SimSettings) -> int:
    """How many objects only the cyclic collector could free once the run is over."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        simulate(trace, settings)
        return gc.collect()
    finally:
        if was_enabled:
            gc.enable()


@pytest.mark.parametrize("kw", [
    dict(),
    dict(compiled=False),
    dict(replicas=4, routing="cache_aware"),
    dict(replicas=4, routing="cache_aware", compiled=False, scheduler="reorder"),
], ids=["default", "python-pool", "4-replicas", "4-replicas-python-reorder"])
def test_a_run_makes_no_cycles_per_request(kw):
    full = read_trace("mooncake-conversation")
    short, long = (Trace(full.requests[:n], block_size=full.block_size) for n in (1_000, 3_000))
    settings = SimSettings.of(capacity_blocks=500, **kw)
    # once first: a first run in a worker fills caches and lazy imports, which may drop what earlier
    # tests left there (85 cyclic objects once, after other tests in the same xdist worker)
    cyclic_garbage_after(short, settings)
    assert cyclic_garbage_after(short, settings) == cyclic_garbage_after(long, settings) == 0

