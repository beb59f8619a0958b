"""Values that cross the cache core's module boundaries: what a request got, what a policy sees."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, runtime_checkable

from shared.index.base import IndexEvent as KvEvent  # the one event type: the pool emits what the index applies


@dataclass(slots=True)
class Allocation:
    """What one request got from the pool; pass it back to ``release``."""

    hashes: Sequence[int]
    hit_idx: list[int]  # depths of reused blocks (after the hit-mode rules)
    new_idx: list[int]  # depths of blocks inserted for this request
    touched_idx: list[int]  # depths of resident blocks this request pinned (a superset of hit_idx)
    session: str | None
    holes: int = 0
    hole_lengths: list[int] = field(default_factory=list)
    # Hashed blocks held as private blocks, outside the hash map (prefix caching off: all of them,
    # none pinned); ``release`` frees them. 0: they are pinned resident blocks (prefix caching on).
    private: int = 0

    @property
    def hit_blocks(self) -> int:
        return len(self.hit_idx)

    @property
    def prefix_blocks(self) -> int:
        """Length of the leading run of reused blocks."""
        idx = self.hit_idx
        if not idx or idx[-1] == len(idx) - 1:  # empty, or one leading run (the common case)
            return len(idx)
        n = 0
        for i in idx:
            if i != n:
                break
            n += 1
        return n


@dataclass(slots=True)
class Lookup:
    """What one request asks of its pool (``acquire``, ``serve``): its blocks and who asks, when.

    ``record``: count it in the hit metrics (False for a preempted request's re-admission);
    ``extra``: unhashed blocks to take with it (a prompt's partial last block, decode KV).
    ``next_use`` and ``position`` are for the offline oracles only (the simulator sets them):
    each block's next access and where this request sits in the order the cache sees accesses.
    """

    hashes: Sequence[int]
    session: str | None = None
    now: float = 0.0
    input_tokens: int | None = None
    record: bool = True
    extra: int = 0
    next_use: Sequence[float] | None = None
    position: float | None = None


@dataclass(slots=True)
class Access:
    """One request's view of the cache, as policies see it (depths ascending)."""

    hashes: Sequence[int]
    touched_idx: list[int]  # depths of blocks that were resident (hits, and in prefix mode recomputed ones)
    new_idx: list[int]  # depths of blocks just inserted
    now: float
    session: str | None = None
    # Oracles only (simulator): time of each block's next access, inf when never again.
    next_use: Sequence[float] | None = None


class PoolOp(NamedTuple):
    """One call on the pool, as a policy with ``observes_pool`` hears it after the pool has run it: what
    the adaptive policy's shadow caches replay through a pool of their own (``replica/core/analysis/shadow.py``).

    ``kind``: ``SERVE`` (a lookup served alone, nothing held after it), ``ACQUIRE`` (a lookup whose blocks
    stay pinned until its ``RELEASE``; both carry the same ``hashes`` object, ``Allocation.hashes``, which
    pairs them), ``STORE`` (``BlockPool.store``: every response block it was given, resident or not).
    ``private``: the unhashed blocks the pool holds after the call (decode KV), which no hashed block can use.
    ``FILL`` (``BlockPool.fill``): blocks a running request just filled, pinned by it until its ``RELEASE``
    (the same ``hashes`` object pairs them); no lookup.
    """

    kind: int
    hashes: Sequence[int]
    now: float
    private: int = 0
    session: str | None = None


SERVE, ACQUIRE, RELEASE, STORE, FILL = range(5)


@dataclass(slots=True)
class PolicyContext:
    """All a policy may read of its pool: no back-reference, nothing it could change.

    ``pinned`` and ``owners`` are read-only live views (hash -> pin count, hash -> owning
    session); ``now`` is the time of the request being served, which cost-aware victims
    score at; ``block_cost`` is the cost model's recompute cost of a block at a depth,
    the same whatever the metrics were told.
    """

    capacity: int
    block_cost: Callable[[int], float]
    pinned: Mapping[int, int]
    owners: Mapping[int, str | None]
    now: float = 0.0
    # Oracles only: where the request being served sits in the order the cache sees accesses
    # (the unit of ``Access.next_use``); the simulator sets it.
    position: float = 0.0
    # The pool's hit mode (``prefix`` or ``holes``): what a hit is, for a policy that counts them (adaptive's shadows).
    hit_mode: str = "holes"


class SchedulerPool(Protocol):
    """What a scheduler uses of its pool: a ``BlockPool``, or its compiled twin in the simulator
    (``replica.core.compiled.pool.CompiledPool``)."""

    capacity: int
    block_size: int

    @property
    def private(self) -> int: ...
    @property
    def pinned(self) -> int: ...
    @property
    def room(self) -> int: ...
    @property
    def pin_counts(self) -> Mapping[int, int]: ...

    def pins_of(self, hashes: Sequence[int]) -> list[int]: ...

    def acquire(self, lookup: Lookup) -> Allocation: ...
    def release(self, alloc: Allocation, now: float = 0.0) -> None: ...
    def take_private(self, n: int) -> None: ...
    def free_private(self, n: int) -> None: ...


@runtime_checkable
class ResponseStore(Protocol):
    """A pool that caches the blocks a request's decoding fills: as they fill (``BlockPool.fill``) and
    what is left when it ends (``BlockPool.store``); the compiled twin does both with LRU and S3-FIFO."""

    def store(self, hashes: Sequence[int], session: str | None = None, now: float = 0.0) -> list[int]: ...
    def fill(self, hashes: Sequence[int], session: str | None = None, now: float = 0.0) -> Allocation | None: ...


__all__ = ["ACQUIRE", "FILL", "RELEASE", "SERVE", "STORE", "Access", "Allocation", "KvEvent", "Lookup", "PolicyContext",
           "PoolOp", "ResponseStore", "SchedulerPool"]
