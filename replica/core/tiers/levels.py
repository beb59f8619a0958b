"""The memory levels below HBM: one registry entry per kind of level.

The hierarchy is an ordered list of levels, HBM first (level 0, the replica's ``BlockPool``),
then the levels ``TierSettings.levels()`` names in order: host DRAM (level 1) and SSD (level 2)
from the flags, then any in ``TierSettings.deeper``. A level is a ``BlockPool`` of its own
capacity and eviction policy and the link its blocks cross on the way up toward HBM; what is
the same for every level (demotion to the next level down, restores, pre-staging while a
request waits, events tagged with the level's index) is ``TierStack``'s.

What differs between kinds is here: the link's default bandwidths, whether the level is host
memory itself (its link up is the device link, HBM <-> host, which every move into or out of
HBM crosses) or a store behind host memory whose reads are staged into host while a request
waits (SSD today; a remote shared KV store, as LMCache or Mooncake's store are, is another),
and whether the torch backend keeps its blocks in memory or in a file.

How the stack runs a level is ``Level``'s (here): its pool, its link, and the hooks where one kind of level
behaves otherwise (the shared store's ``SharedLevel``, replica/core/tiers/shared.py: written through, read
over two links, its events and figures the store's), so ``TierStack`` treats every level alike.

Its name is the level's label in metrics (``tier="host"``), in ``/stats`` and ``kvemu sim``'s
JSON (``host_block_hit_ratio``), in the torch backend's copies and as its link's name; on the
wire and in the index a level is its index, so shared/ and router/ know no names.

Adding a kind of level: a module defining its ``LevelKind`` (with the routing hit cost of its
blocks), one entry in ``LEVELS`` and its tests; configure it with
``TierSettings(deeper=(LevelSettings("name", blocks=...),))``.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from replica.core.cache.pool import Allocation, BlockPool, KvEvent
from replica.core.cache.types import Lookup
from replica.core.tiers.link import Link
from shared.errors import InputError
from shared.validate import check_number

# One PCIe 4.0 NVMe drive, sequential.
SSD_READ_GBPS = 7.0
SSD_WRITE_GBPS = 5.0


@dataclass(frozen=True, slots=True)
class LevelKind:
    """What is particular to one kind of level."""

    name: str
    read_gbps: float  # its link up, GB/s, unless its LevelSettings say otherwise
    write_gbps: float
    host_memory: bool = False  # host DRAM: its link is the device link, reads are not staged
    in_file: bool = False  # the torch backend keeps its blocks in a memory-mapped file
    # What cache_aware routing charges for a prefix block a replica holds in this level, as a fraction
    # of computing it (its fetch over its recompute; 0: free like an HBM hit, 1: as a miss), unless
    # `--set <name>_hit_cost=C` says otherwise (RoutingSettings.level_hit_costs, by level index)
    hit_cost: float = 1.0
    given: bool = False  # one store for many replicas: given to each replica's stack, not built by it


HOST = LevelKind("host", read_gbps=55.5, write_gbps=55.5, host_memory=True, hit_cost=0.1)
SSD = LevelKind("ssd", read_gbps=SSD_READ_GBPS, write_gbps=SSD_WRITE_GBPS, in_file=True, hit_cost=0.5)
# The cluster's shared store (replica/core/tiers/shared.py): behind host memory like SSD, read over the
# replica's RDMA NIC (50 GB/s at 400 Gb/s, several times an NVMe drive), so a hit costs less than SSD's
SHARED = LevelKind("shared", read_gbps=50.0, write_gbps=50.0, hit_cost=0.3, given=True)

# The kinds a TierSettings may name, by name.
LEVELS: dict[str, LevelKind] = {"host": HOST, "ssd": SSD, "shared": SHARED}


def level_kind(name: str) -> LevelKind:
    kind = LEVELS.get(name)
    if kind is None:
        raise InputError("level", f"unknown memory level {name!r}; known: {', '.join(LEVELS)}")
    return kind


def level_hit_costs(levels: Sequence[LevelSettings]) -> tuple[float, ...]:
    """Routing's hit cost of each level of ``levels`` (level 1 first): its kind's."""
    return tuple(level_kind(level.kind).hit_cost for level in levels)


@dataclass(frozen=True, slots=True)
class LevelSettings:
    """One level of the hierarchy below HBM; ``blocks`` 0: the level is absent (its link stays,
    as the SSD link is reported without an SSD tier)."""

    kind: str
    blocks: int = 0
    policy: str = "lru"
    read_gbps: float | None = None  # None: the kind's
    write_gbps: float | None = None
    per_copy_s: float = 0.0  # each copy call's fixed cost on its link
    latency_s: float = 0.0  # every read's base latency on its link (the shared store's metadata round trip)

    def __post_init__(self) -> None:
        level_kind(self.kind)
        if isinstance(self.blocks, bool) or not isinstance(self.blocks, int) or self.blocks < 0:
            raise InputError(f"{self.kind}_blocks", f"must be an integer >= 0, got {self.blocks!r}")
        for name in ("read_gbps", "write_gbps"):
            value = getattr(self, name)
            if value is not None:
                check_number(f"{self.kind}_{name}", value, above=0)

    @property
    def read(self) -> float:
        return level_kind(self.kind).read_gbps if self.read_gbps is None else self.read_gbps

    @property
    def write(self) -> float:
        return level_kind(self.kind).write_gbps if self.write_gbps is None else self.write_gbps


class LevelPool(Protocol):
    """What the stack asks of a level's pool: the ``BlockPool`` itself, or its compiled twin
    (``replica.core.compiled.pool.CompiledPool``, which the simulator puts in its place)."""

    capacity: int

    @property
    def pinned(self) -> int: ...
    @property
    def held(self) -> Container[int]: ...
    def admit(self, hashes: Sequence[int], now: float = 0.0) -> None: ...
    def acquire(self, lookup: Lookup) -> Allocation: ...
    def release(self, alloc: Allocation, now: float = 0.0) -> None: ...
    def remove(self, hashes: Sequence[int], computed: bool = True) -> None: ...
    def absent(self, hashes: Sequence[int]) -> list[int]: ...
    def admit_absent(self, hashes: Sequence[int], now: float = 0.0) -> list[int]: ...
    def settle(self) -> BlockPool: ...


@dataclass(slots=True)
class Level:
    """One level below HBM as the stack runs it: ``serving`` takes its calls and ``held`` answers
    what it holds (the ``BlockPool`` and its resident map, or the pool's compiled twin in both
    places, see ``TierStack.serve_levels_with``); ``pool`` is the ``BlockPool``, current.

    A replica's own level: its evictions spill to the level below, its reads behind host memory are
    staged while a request waits, its events and figures are the replica's. A kind that differs
    overrides the hooks (``SharedLevel``)."""

    index: int  # 1: next to HBM
    name: str
    serving: LevelPool
    link: Link | None  # its own link up; None: host memory, whose link is the device link
    write_bw: float  # bytes/s a write down to it takes on ``link``
    shared: ClassVar[bool] = False  # the cluster's shared store (SharedLevel)

    @property
    def writes_through(self) -> bool:
        """Written as requests finish (``through``): what it should hold it got, so it takes no evictions."""
        return False

    @property
    def held(self) -> Container[int]:
        return self.serving.held

    @property
    def pool(self) -> BlockPool:
        """The level's ``BlockPool``, with what its compiled twin reached written into it."""
        return self.serving.settle()

    @property
    def staged_link(self) -> Link | None:
        """The link a waiting request's reads are staged on (None: read at admission, or host memory)."""
        return self.link

    def read_links(self) -> tuple[Link, ...]:
        """The links a read from it crosses before the device link (none from host memory)."""
        return () if self.link is None else (self.link,)

    def write(self, now: float, nbytes: int) -> None:
        """``nbytes`` written into it at ``now``: their transfers on its links."""
        if self.link is not None:
            self.link.start(now, nbytes, rate=self.write_bw)

    def spill_into(self, sink: Callable[[Sequence[int]], None]) -> None:
        """Its evictions go to ``sink`` (the level below, or out of the hierarchy)."""
        self.pool.evicted_sink = sink

    def through(self, hashes: Sequence[int], stored: Sequence[int]) -> Sequence[int]:
        """What a finished request writes through to it (its prompt's ``hashes``, the response blocks it
        ``stored``): nothing to a replica's own level."""
        return ()

    def serve_with(self, twin: Callable[[str, BlockPool], LevelPool | None]) -> LevelPool | None:
        """Its compiled twin in its pool's place where ``twin`` makes one; the twin, or None."""
        fast = twin(self.name, self.pool)
        if fast is not None:
            self.serving = fast
        return fast

    def drain_events(self) -> list[KvEvent]:
        """Its pool's events since the last drain, tagged with its index (a router's index learns them)."""
        return [KvEvent(e.kind, e.hashes, self.index) for e in self.pool.drain_events()]

    def snapshot_events(self) -> list[KvEvent]:
        """``stored`` of every block it holds (a resync), dropping the events not yet drained."""
        pool = self.pool
        pool.drain_events()
        return [KvEvent("stored", tuple(pool.resident), self.index)] if pool.resident else []

    def report(self, out: dict) -> None:
        """Its figures in the stack's ``stats``."""
        out[f"{self.name}_blocks"] = self.serving.capacity
        out[f"{self.name}_used_blocks"] = self.pool.used
        out[f"{self.name}_policy"] = self.pool.policy.name
