"""The block pool with LRU, S3-FIFO, Belady or BeladyCompute, compiled: the simulator's fast path for one replica.

A ``BlockPool`` call costs microseconds of interpreter work whatever the dict and deque
operations under it, and a virtual-time run makes millions of them; cache simulators
(libCacheSim) run theirs in C. ``CompiledPool`` answers the calls a scheduler makes
(``acquire``, ``release``, ``take_private``, ``free_private``, ``fill``, ``store``, the room queries) and the
cache-only replay (``serve_requests``, a whole trace in one call) from ``_pool.Pool``
(``_pool.c``, built at install where a C compiler is present). ``settle`` writes what it
reached into the Python pool it was made from: the same resident blocks in the same order,
owners, footprints, reused set, pins, policy order and metrics that the same calls on that pool
leave (``tests/replica/core/compiled/test_compiled_pool.py`` drives both with random calls and compares
their whole state). The Python pool stays the definition and what everything else reads.

It is made only where it gives that same pool, and ``why_not`` (``compilable``) is the one place
that decides it: an empty pool and a fresh policy of exactly a class with an adapter
(``replica.core.compiled.adapters``: LRU, S3-FIFO, Belady, BeladyCompute), fresh metrics, no events
to ship (several replicas are asked directly: ``prefix_matches``), lower tiers only with HBM caching (fed each
call's evictions, asked ``missing``; a tier level's own pool runs a twin too, with LRU or S3-FIFO: ``why_not(level=True)``,
``KernelLevels``), response KV kept
only with LRU or S3-FIFO (``store``; ``fill`` is ``BlockPool.fill``'s rule over the kernel's
calls), prefix caching on (either admission order: the scheduler
asks ``pins_of``), and
block hashes that are 64-bit unsigned integers (the simulator checks a trace's). ``build_core`` asks it; the simulator
reports which ran (``engine`` in its JSON); ``--python-core`` asks for the Python pool.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Container, Mapping, Sequence
from itertools import chain

import numpy as np

from replica.core.analysis.shards import ShardsTracker
from replica.core.cache.metrics import PoolMetrics
from replica.core.cache.policies import policy_class
from replica.core.cache.pool import BlockPool, PoolBusyError, PoolCapacityError, fill_picks
from replica.core.cache.types import Allocation, Lookup
from replica.core.compiled.adapters import ADAPTERS, MISSING, adapter_for
from replica.core.compiled.adapters import kernel_module as _pool
from shared.errors import InputError

_Refused = _pool.Refused if _pool is not None else RuntimeError  # what the compiled calls raise when they cannot
# Why a compiled call refused, as the extension defines the codes (no kernel: nothing refuses)
_TOO_LONG, _REPEATS, _BUSY = (_pool.TOO_LONG, _pool.REPEATS, _pool.BUSY) if _pool is not None else (-1, -1, -1)

__all__ = ["CompiledPool", "KernelLevels", "compilable", "compiled", "compiles", "hashes_fit", "hashes_u64", "prefix_matches", "why_not"]

CHUNK = 8192  # requests per call of the cache-only replay: progress between calls
_U64 = 1 << 64
MAX_BLOCKS = 1 << 23  # larger pools run the Python one, whose memory grows with what is cached


def compiled() -> bool:
    """Whether the compiled pool was built on this machine (and matches its source)."""
    return _pool is not None


def why_not(pool: BlockPool, *, tiers: bool = False, keeps_response_kv: bool = False, hbm_caching: bool = True,
            hashes_fit: bool = True, level: bool = False, kv_groups: int = 1) -> str | None:
    """Why ``CompiledPool(pool)`` would not be this pool's exact twin where it runs (None: it would).

    ``tiers``: lower memory tiers sit below it (they hear of its evictions after each call; without
    ``hbm_caching`` they also take blocks out of it, which only the Python pool does); ``keeps_response_kv``: its scheduler stores response
    blocks (``BlockPool.store``: the kernel's covers LRU and S3-FIFO, not the oracles, whose stored
    blocks would need a next use); ``hashes_fit``: every hash it will see is a
    64-bit unsigned integer (what the kernel keys on; ``hashes_u64`` tells); ``level``: it is a memory
    level below HBM (``TierStack``), whose fetched blocks leave it (``remove``: LRU and S3-FIFO, as ``store``);
    ``kv_groups``: the model's KV cache groups (several: a table per group per request, ``cache/grouped.py``).
    """
    if kv_groups > 1:  # before MISSING: the reason holds on every machine
        return f"a model of {kv_groups} KV cache groups needs the Python pool (a block table per group)"
    if _pool is None:
        return MISSING
    adapter = adapter_for(pool.policy)
    if adapter is None or adapter.params(pool.policy) is None:
        return f"policy {pool.policy.name} is not compiled or not fresh"
    if not pool.prefix_caching:  # no lookups, no cache: the Python pool's private blocks are already cheap
        return "prefix caching off needs the Python pool"
    if tiers and not hbm_caching:
        return "HBM without caching (--no-hbm-caching) needs the Python pool"
    if keeps_response_kv and not adapter.stores:
        return f"kept response KV with {pool.policy.name} needs the Python pool (the compiled store has LRU and S3-FIFO)"
    if level and not adapter.stores:
        return f"a tier level with {pool.policy.name} needs the Python pool (the compiled remove has LRU and S3-FIFO)"
    if not hashes_fit:
        return "a block hash is not a 64-bit unsigned integer"
    if pool.resident or pool.private or pool.pinned:
        return "the pool is not empty"
    if pool.metrics.requests:
        return "its metrics are not fresh"
    if pool.emit_events:
        return "the pool ships events"
    if pool.capacity > MAX_BLOCKS:  # its arrays are allocated up front: ~60 bytes a block
        return f"the pool is larger than {MAX_BLOCKS:,} blocks (the compiled pool allocates them up front)"
    return None


def compilable(pool: BlockPool, *, tiers: bool = False, keeps_response_kv: bool = False, hbm_caching: bool = True,
               hashes_fit: bool = True) -> bool:
    """Whether ``CompiledPool(pool)`` runs: the one decision (``why_not`` says why not)."""
    return why_not(pool, tiers=tiers, keeps_response_kv=keeps_response_kv, hbm_caching=hbm_caching,
                   hashes_fit=hashes_fit) is None


def compiles(policy: str) -> bool:
    """Whether the compiled pool has this policy (by its registered name): a cheap first look that
    spares the simulator checking a trace's hashes for a policy ``compilable`` would refuse anyway."""
    return _pool is not None and policy_class(policy) in ADAPTERS


def hashes_u64(hash_lists: Sequence[Sequence[int]]) -> np.ndarray | None:
    """Every hash in order as ``uint64`` (what the compiled pool keys on), or None if one is not."""
    if _pool is not None:  # the kernel's one pass over Python ints
        try:
            return np.frombuffer(_pool.flat_keys(hash_lists), dtype=np.uint64)
        except OverflowError:
            return None
        except TypeError:
            pass  # not all Python ints (numpy's, say): array takes what has __index__
    try:  # array's C loop takes a list's ints three times faster than numpy's fromiter
        return np.frombuffer(array("Q", chain.from_iterable(hash_lists)), dtype=np.uint64)
    except (OverflowError, TypeError, ValueError):
        return None


def hashes_fit(hash_lists: Sequence[Sequence[int]]) -> bool:
    """Whether every hash is in the 64-bit unsigned range the compiled pool keys on, without building
    ``hashes_u64``'s array: a ``min`` and a ``max`` per list, in C (the trace readers checked the types;
    a value of another type is refused by the kernel, as ``block_hashes``)."""
    try:
        return all(not h or (min(h) >= 0 and max(h) < _U64) for h in hash_lists)
    except TypeError:
        return False


def prefix_matches(pools: Sequence[CompiledPool], hashes: Sequence[int]) -> list[int]:
    """``prefix_match`` of ``hashes`` in each of ``pools``, in one call into the kernel."""
    assert _pool is not None  # a CompiledPool exists only where the kernel does
    return _pool.prefix_matches([p._kernel for p in pools], hashes)


def _not_u64() -> InputError:
    return InputError("block_hashes", "the compiled pool keys on 64-bit unsigned integers"
                      " (hashes_u64 tells; the simulator runs the Python pool for a trace it refuses)")


class KernelLevels:
    """``replica.core.tiers.stack.LevelQueries`` over tier levels that all run compiled: each query one
    call into the kernel (``HeldLevels`` is the definition; the equivalence tests compare both)."""

    __slots__ = ("_kernels",)

    def __init__(self, levels: Sequence[CompiledPool]) -> None:
        self._kernels = [level._kernel for level in levels]

    def runs(self, hashes: Sequence[int], depths: Sequence[int]) -> list[tuple[int, int, int]]:
        assert _pool is not None  # a CompiledPool exists only where the kernel does
        return _pool.level_runs(self._kernels, hashes, depths)

    def lower_counts(self, hashes: Sequence[int], start: int) -> list[int]:
        assert _pool is not None
        return _pool.lower_counts(self._kernels, hashes, start)


class CompiledPool:
    """``pool``'s compiled twin: hand it the calls, then ``settle()`` before reading ``pool``."""

    def __init__(self, pool: BlockPool) -> None:
        reason = why_not(pool, tiers=pool.evicted_sink is not None)  # a pool with a sink feeds its tiers
        if reason is not None:
            raise ValueError(f"no compiled pool: {reason}")
        self.pool = pool
        self.capacity = pool.capacity
        self.block_size = pool.block_size
        self._reuse = pool.metrics.reuse
        self._costs = pool.metrics.costs
        self._cost_len = 64
        self._codes: dict[str | None, int] = {}
        self._now = pool.now
        adapter = adapter_for(pool.policy)
        assert _pool is not None and adapter is not None  # why_not said so
        params = adapter.params(pool.policy) or {}
        self._adapter = adapter
        self._kernel = _pool.Pool(kind=getattr(_pool, adapter.kind), capacity=pool.capacity,
                                  block_size=pool.metrics.block_size, prefix_mode=pool.hit_mode == "prefix",
                                  cum=self._cum(self._cost_len), **params)
        self._cost_aware = adapter.cost_aware  # BeladyCompute reads the policy's cost per depth
        self._sink = pool.evicted_sink  # a lower tier (TierStack): hears of each call's evictions after it
        if self._sink is not None:
            self._kernel.record_evicted(True)
        # SHARDS (the default reuse tracker) has the kernel sample what it records, where the keys are
        self._sampled: ShardsTracker | None = self._reuse if isinstance(self._reuse, ShardsTracker) else None
        if self._sampled is not None:
            self._sampled.sample_in(self._kernel)
        if self._cost_aware:
            self._kernel.set_policy_costs(self._policy_costs(self._cost_len))
        self._settled = True

    # ---- what a scheduler asks (BlockPool's names and meanings) -------------------
    @property
    def private(self) -> int:
        return self._kernel.private

    @property
    def pinned(self) -> int:
        return self._kernel.pinned

    @property
    def free(self) -> int:
        k = self._kernel
        return self.capacity - k.used - k.private

    @property
    def room(self) -> int:
        k = self._kernel
        return self.capacity - k.pinned - k.private

    def usage(self) -> float:
        k = self._kernel
        return (k.used + k.private) / self.capacity

    @property
    def pin_counts(self) -> Mapping[int, int]:
        return self.settle().pin_counts  # O(resident): for inspection; the scheduler asks pins_of

    def acquire(self, lookup: Lookup) -> Allocation:
        hashes, session, now, input_tokens, record = (lookup.hashes, lookup.session, lookup.now, lookup.input_tokens,
                                                      lookup.record)
        n = len(hashes)
        if n >= self._cost_len:
            self._grow_costs(n)
        code = self._session_code(session)
        try:
            hit, new, touched, holes = self._kernel.acquire(hashes, code, -1 if input_tokens is None else input_tokens,
                                                            record, lookup.extra, lookup.next_use, lookup.position)
        except _Refused as refused:
            raise self._refusal(refused, n, now) from None
        except (OverflowError, TypeError):
            raise _not_u64() from None
        self._acquired(hashes, now, record)
        return Allocation(hashes, hit, new, touched, session, len(holes), holes)

    def admit(self, hashes: Sequence[int], now: float = 0.0) -> None:
        """``BlockPool.admit``: acquired and released in one call into the kernel, which hands nothing back
        (a cluster's demotions into its host tiers made lists that were only freed)."""
        n = len(hashes)
        if n >= self._cost_len:
            self._grow_costs(n)
        code = self._session_code(None)
        try:
            self._kernel.serve_one(hashes, code, True)
        except _Refused as refused:
            raise self._refusal(refused, n, now) from None
        except (OverflowError, TypeError):
            raise _not_u64() from None
        self._acquired(hashes, now, True)

    def admit_absent(self, hashes: Sequence[int], now: float = 0.0) -> list[int]:
        """``BlockPool.admit_absent`` in one kernel call (the level's table looked up once, the keys
        converted once)."""
        n = len(hashes)
        if n >= self._cost_len:
            self._grow_costs(n)
        code = self._session_code(None)
        room = self.capacity - self._kernel.pinned
        try:
            new = self._kernel.admit_absent(hashes, code)
        except _Refused as refused:
            raise self._refusal(refused, min(n, room), now) from None
        except (OverflowError, TypeError):
            raise _not_u64() from None
        if new and room > 0:
            self._acquired(new[:room] if self._reuse is not None else (), now, True)
        return new

    def _session_code(self, session: str | None) -> int:
        """The kernel's number for a session: in order of first appearance."""
        code = self._codes.get(session)
        if code is None:
            code = self._codes[session] = len(self._codes)
        return code

    def _refusal(self, refused: Exception, n: int, now: float) -> Exception:
        if refused.args[0] == _BUSY and now > self._now:  # the pool's clock moved before it looked for room
            self._now = now
        return self._error(n, *refused.args)

    def _acquired(self, hashes: Sequence[int], now: float, record: bool) -> None:
        """After an acquire: the clock, the evictions to the tier below, the reuse tracker."""
        self._settled = False
        if now > self._now:
            self._now = now
        if self._sink is not None:
            self._feed()
        if record and self._reuse is not None:
            if self._sampled is not None:
                self._sampled.defer_sampled(len(hashes), now)
            else:
                self._reuse.defer(hashes, now)

    def _feed(self) -> None:
        """Hand what the last call evicted to the lower tier, in eviction order (as ``BlockPool._evict``
        does within the call: the tier reads nothing of this pool, so after it is the same)."""
        victims = self._kernel.take_evicted()
        if victims and self._sink is not None:
            self._sink(victims)

    def missing(self, hashes: Sequence[int]) -> list[int]:
        """``BlockPool.missing``: depths of the blocks not resident."""
        return self._kernel.missing(hashes)

    def release(self, alloc: Allocation, now: float = 0.0) -> None:
        self._kernel.release(alloc.hashes)
        self._settled = False

    def absent(self, hashes: Sequence[int]) -> list[int]:
        """``BlockPool.absent``: the hashes not resident, in order."""
        return self._kernel.absent(hashes)

    def remove(self, hashes: Sequence[int], computed: bool = True) -> None:
        """``BlockPool.remove``: unpinned resident blocks leave (a block promoted out of a lower tier)."""
        self._kernel.remove(hashes, computed)
        self._settled = False

    @property
    def held(self) -> Container[int]:
        """What it holds, for membership tests (``h in held``, as of ``BlockPool.resident``), in C."""
        return self._kernel

    @property
    def used(self) -> int:
        return self._kernel.used

    def pins_of(self, hashes: Sequence[int]) -> list[int]:
        """``BlockPool.pins_of``: running requests holding each block (0: none)."""
        return self._kernel.pins_of(hashes)

    def store(self, hashes: Sequence[int], session: str | None = None, now: float = 0.0) -> list[int]:
        """``BlockPool.store``: a finished request's response blocks cached (the hashes inserted)."""
        code = self._session_code(session)
        if len(hashes) >= self._cost_len:
            self._grow_costs(min(len(hashes), self.capacity))
        try:
            stored = self._kernel.store(hashes, code)
        except (OverflowError, TypeError):
            raise InputError("block_hashes", "the compiled pool keys on 64-bit unsigned integers") from None
        if stored:
            self._settled = False
            if now > self._now:
                self._now = now
            if self._sink is not None:
                self._feed()
        return stored

    def fill(self, hashes: Sequence[int], session: str | None = None, now: float = 0.0) -> Allocation | None:
        """``BlockPool.fill``: the same rule (``fill_picks``) and the same calls, on the kernel."""
        take = fill_picks(hashes, self._kernel.pins_of(hashes))
        if not take:
            return None
        self.free_private(len(take))
        return self.acquire(Lookup(take, session, now, record=False))

    def serve(self, lookup: Lookup) -> Allocation:
        alloc = self.acquire(lookup)
        self.release(alloc, lookup.now)
        return alloc

    def take_private(self, n: int) -> None:
        try:
            self._kernel.take_private(n)
        except _Refused as refused:
            raise self._error(n, *refused.args) from None
        self._settled = False
        if self._sink is not None:
            self._feed()

    def free_private(self, n: int) -> None:
        self._kernel.free_private(n)
        self._settled = False

    # ---- the cache-only replay: a trace in one call --------------------------------
    def serve_requests(self, requests: Sequence, progress: Callable[[int], None] | None = None,
                       next_use: np.ndarray | None = None, hashes: np.ndarray | None = None,
                       responses: Sequence[Sequence[int]] | None = None) -> int:
        """``serve`` each of ``requests`` (``hash_ids``, ``session``, ``input_tokens``, ``t``) in
        order, then ``store`` its ``responses[k]`` where given; returns how many were served: all,
        unless one could not be (the caller serves it through ``serve``, which raises the pool's
        error). ``next_use``: every block access's next use, in order (the oracles');
        ``hashes``: ``hashes_u64`` of the requests, if made already."""
        if not requests or self.pinned or self.private or self._sink is not None:
            return 0
        lengths = np.fromiter(map(len, (r.hash_ids for r in requests)), dtype=np.int64, count=len(requests))
        offsets = np.zeros(len(requests) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        if hashes is None:
            hashes = hashes_u64([r.hash_ids for r in requests])
        if hashes is None:
            return 0  # not all 64-bit unsigned: served one by one, where serve names the problem
        codes, setdefault = self._codes, self._codes.setdefault
        sessions = np.fromiter((setdefault(r.session, len(codes)) for r in requests), dtype=np.int32,
                               count=len(requests))
        tokens = np.fromiter((-1 if r.input_tokens is None else r.input_tokens for r in requests), dtype=np.int64,
                             count=len(requests))
        resp = resp_offsets = None
        if responses is not None:
            resp = hashes_u64(responses)
            if resp is None:
                return 0
            resp_offsets = np.zeros(len(requests) + 1, dtype=np.int64)
            np.cumsum(np.fromiter(map(len, responses), dtype=np.int64, count=len(requests)), out=resp_offsets[1:])
            if len(resp):
                self._grow_costs(min(int(np.diff(resp_offsets).max()), self.capacity))
        self._grow_costs(min(int(lengths.max()), self.capacity))
        done = 0
        while done < len(requests):
            stop = min(done + CHUNK, len(requests))
            reached = self._kernel.serve(hashes, offsets, sessions, tokens, next_use, done, stop, resp, resp_offsets)
            if self._reuse is not None:
                for r in requests[done:reached]:
                    self._reuse.defer(r.hash_ids, r.t)
            done = reached
            if progress is not None:
                progress(done)
            if reached < stop:
                break
        if done:
            self._settled = False
            self._now = max(self._now, max(r.t for r in requests[:done]))
        return done

    # ---- the Python pool ----------------------------------------------------------
    def settle(self) -> BlockPool:
        """Write the compiled pool's state into the Python pool (a no-op when nothing changed)."""
        if self._settled:
            return self.pool
        state = self._kernel.state()
        names = list(self._codes)
        pool = self.pool
        pool.load_state(zip(state["keys"], map(names.__getitem__, state["owners"])),
                        ((names[code], count) for code, count in state["footprint"]), state["reused"],
                        state["refs"], self._kernel.private)
        self._adapter.load(pool.policy, state)
        pool.metrics.load_counts(state["metrics"])
        if self._now > pool.policy_context.now:
            pool.policy_context.now = self._now
        self._settled = True
        return pool

    @property
    def metrics(self) -> PoolMetrics:
        return self.settle().metrics

    def stats(self, top_k: int = 10) -> dict:
        return self.settle().stats(top_k)

    # ---- internals ----------------------------------------------------------------
    def _policy_costs(self, n: int) -> np.ndarray:
        """What cost-aware policies see per depth (the pool's ``block_cost``), depths 0..n."""
        return np.array([self.pool.block_cost(d) for d in range(n + 1)], dtype=np.float64)

    def _cum(self, n: int) -> np.ndarray:
        return np.array(self._costs.prefix_sums(n), dtype=np.float64)

    def _grow_costs(self, n: int) -> None:
        """The kernel's cost table reaches at least ``n`` blocks (doubling, so rarely)."""
        if n < self._cost_len:
            return
        while self._cost_len <= n:
            self._cost_len *= 2
        self._kernel.set_costs(self._cum(self._cost_len))
        if self._cost_aware:
            self._kernel.set_policy_costs(self._policy_costs(self._cost_len))

    def _error(self, n: int, code: int, shortfall: int, available: int) -> Exception:
        if code == _TOO_LONG:
            return PoolCapacityError(n, self.capacity)
        if code == _REPEATS:
            return InputError("block_hashes", "a block hash repeats within one request; chained hashes never do")
        return PoolBusyError(f"need {shortfall} more free blocks, only {available} evictable")
