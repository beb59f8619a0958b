"""The cache-only replay, compiled: a pool with LRU or S3-FIFO serving a trace one request at a time.

``BlockPool.serve`` in a Python loop costs a few microseconds of interpreter work per request
whatever the kernel of dict and deque operations under it; cache simulators (libCacheSim) run the
whole loop in C. ``serve_requests`` hands the loop to ``_replay.Kernel`` (``_replay.c``, built at
install when a C compiler is present) and writes what it reached back into the pool, its policy
and its metrics, so that afterwards the pool is exactly the one the Python loop leaves: the same
resident blocks in the same order, owners, footprints, reused set, policy order and every metric
(``tests/replica/core/test_replay.py`` compares them after random traces). The Python pool stays
the definition; the kernel is its fast path for the one case a cache study runs most.

It runs only where it gives that same pool: an empty pool and a fresh policy of exactly
``LRUPolicy`` or ``S3FIFOPolicy``, fresh metrics without reuse tracking, no events to ship (one
replica) and no lower tier. A request it cannot serve (longer than the pool, a hash that repeats,
a hash that is not a 64-bit unsigned integer) stops it there: the caller goes on from that request
with the Python pool, which raises the usual error.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from itertools import chain
from pathlib import Path

import numpy as np

from replica.core.metrics import ReplayedRequests
from replica.core.pool import BlockPool

try:
    from replica.core import _replay  # type: ignore[attr-defined]
    _MISSING = ""
except ImportError:  # built without a C compiler: the Python pool replays instead
    _replay = None
    _MISSING = "the compiled kernel is not built (no C compiler at install)"
else:  # a source checkout whose kernel source changed since it was built: never run the old one
    _source = Path(__file__).with_name("_replay.c")
    if _source.exists() and hashlib.sha256(_source.read_bytes()).hexdigest() != _replay.SOURCE_SHA256:
        _replay = None
        _MISSING = "the compiled kernel is older than _replay.c (run `pip install -e .` again)"

__all__ = ["compiled", "serve_requests", "why_not"]

CHUNK = 8192  # requests per kernel call: progress between calls


def compiled() -> bool:
    """Whether the kernel was built on this machine."""
    return _replay is not None


def why_not(pool: BlockPool) -> str | None:
    """Why the kernel cannot serve this pool (None: it can)."""
    if _replay is None:
        return _MISSING
    params = getattr(pool.policy, "replay_params", None)
    if params is None or params() is None:
        return f"policy {pool.policy.name} is not compiled or not fresh"
    if pool.resident or pool.private or pool.pin_counts:
        return "the pool is not empty"
    m = pool.metrics
    if m.requests or m.reuse is not None:
        return "metrics are not fresh or track reuse distances"
    if pool.emit_events or pool.evicted_sink is not None:
        return "the pool ships events or feeds a lower tier"
    if pool.capacity > 1 << 29:
        return "the pool is larger than the kernel's 2^29 blocks"
    return None


def serve_requests(pool: BlockPool, requests: Sequence, progress: Callable[[int], None] | None = None) -> int:
    """Serve ``requests`` (``hash_ids``, ``session``, ``input_tokens``, ``t``) in order, as
    ``pool.serve`` would one by one; returns how many were served (all of them, unless one could
    not be: the caller serves the rest through the Python pool). 0 when ``why_not(pool)``."""
    if why_not(pool) is not None or not requests:
        return 0
    lengths = np.fromiter(map(len, (r.hash_ids for r in requests)), dtype=np.int64, count=len(requests))
    offsets = np.zeros(len(requests) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    try:
        hashes = np.fromiter(chain.from_iterable(r.hash_ids for r in requests), dtype=np.uint64,
                             count=int(offsets[-1]))
    except (OverflowError, TypeError, ValueError):  # not 64-bit unsigned: the Python pool takes them all
        return 0
    names: dict = {}
    sessions = np.fromiter((names.setdefault(r.session, len(names)) for r in requests), dtype=np.int32,
                           count=len(requests))
    cum = np.array(pool.metrics.costs.prefix_sums(int(lengths.max())), dtype=np.float64)
    params = pool.policy.replay_params()  # type: ignore[attr-defined]
    kernel = _replay.Kernel(capacity=pool.capacity, prefix_mode=pool.hit_mode == "prefix", sessions=len(names),
                            **params)
    hits, prefix, holes = (np.zeros(len(requests), dtype=np.int32) for _ in range(3))
    done = 0
    while done < len(requests):
        stop = min(done + CHUNK, len(requests))
        reached = kernel.serve(hashes, offsets, sessions, done, stop, cum, hits, prefix, holes)
        done = reached
        if progress is not None:
            progress(done)
        if reached < stop:
            break
    if done:
        _write_back(pool, kernel.state(), list(names), requests[:done], lengths[:done], hits[:done],
                    prefix[:done], holes[:done])
    return done


def _write_back(pool: BlockPool, state: dict, names: list, served: Sequence, blocks: np.ndarray,
                hits: np.ndarray, prefix: np.ndarray, holes: np.ndarray) -> None:
    """Make the Python pool, policy and metrics what serving ``served`` one by one leaves."""
    pool.load_replayed(zip(state["keys"], map(names.__getitem__, state["owners"])),
                       ((names[code], count) for code, count in state["footprint"]), state["reused"])
    pool.policy.load_replayed(state)  # type: ignore[attr-defined]
    tokens = np.fromiter((-1 if r.input_tokens is None else r.input_tokens for r in served), dtype=np.int64,
                         count=len(served))
    pool.metrics.record_replayed(ReplayedRequests(
        blocks, hits, prefix, holes, tokens, state["cost_total"], state["cost_hit"], state["hole_length_log2"],
        state["hole_blocks"], state["inserted"], state["evictions"], state["one_hit_evictions"]))
    latest = max(r.t for r in served)
    ctx = pool.policy_context
    if latest > ctx.now:
        ctx.now = latest
