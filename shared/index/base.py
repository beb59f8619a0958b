"""The prefix index contract: event batches, their wire form, results and the protocol.

A replica ships its block pool's ``stored`` / ``removed`` / ``cleared`` events in batches
stamped with its id, an epoch (new on every restart) and a sequence number.  The index
uses epoch and sequence to notice restarts and lost batches, the two ways the indexes of
llm-d, Dynamo and SGLang routers drift into advertising blocks a replica no longer has.

Both backends share these rules, per replica:

* first batch ever (or after ``clear_replica``), or a new epoch: start from an empty view
  (a new epoch first clears what the old incarnation had);
* ``seq == last_seq + 1``: apply;
* ``seq > last_seq + 1`` (a gap): clear the replica, count the gap, then apply;
* the whole batch at or below ``last_seq``: a duplicate, ignored and counted; a batch that
  overlaps ``last_seq`` applies only its unseen tail (so a retried apply is harmless);
* an empty batch is a heartbeat: its ``seq`` is the next one the replica will send, which
  lets the index see a gap before the next real batch arrives.

``synced`` is False while the index knows it is missing some of the replica's blocks
(after a gap, a first contact in mid-stream, or entries refused because the index is
full); the replica's next ``cleared`` event (followed by ``stored`` of what it holds)
makes it True again.  Missing entries only under-report: the index never claims a block
that a replica evicted, because every path that loses information clears first.

Memory levels: a replica with levels below HBM (host DRAM, SSD, ...) also ships ``stored`` /
``removed`` events tagged with the level's index (``IndexEvent.level``: 1 host DRAM, 2 SSD, ...;
untagged events are HBM, level 0, so the wire form of a replica without tiers is unchanged). The
index keeps each level's blocks per replica under the same epoch / sequence / gap rules;
``cleared`` (never tagged) clears every level of the replica, so a resync (``cleared``, then
``stored`` per level) rebuilds all of it. A lookup reports, besides each replica's HBM prefix,
the run of blocks right after it that the replica's lower levels hold (the upper level looked up
first), as ``"<id>#1"``, ``"<id>#2"``, ... (``level_key``): what the simulator's
``TierStack.lower_overlap`` gives and what ``cache_aware`` prices by each level's hit cost. The
index knows levels by index only; their names are the replica's (replica/core/tiers/levels.py).

Shared stores: a KV store several replicas share (Mooncake's store, LMCache's remote level; the
last level of each replica's hierarchy, replica/core/tiers/shared.py) publishes its own feed under
its own id, untagged (its events' levels, if any, are ignored). ``add_store(StoreScope(id, level,
replicas))`` declares that id a store: its blocks are one set (no HBM entry, bounded by
``max_entries`` like every entry, under the same epoch / sequence / gap rules), and a lookup
answers, for every replica it serves (``replicas``; empty: every replica the index knows), the run
of the prompt after that replica's own prefix (HBM, then its own levels, then the store: the
store is the last level, ``level`` its index) as ``"<id>#<level>"``: ``lower_run_counts`` over the
replica's levels with the store appended (``store_levels``), what ``TierStack.lower_overlap``
answers in virtual time, where the store is the stack's last level. A store never answers as a
replica. A replica served by several stores is served by the first declared.

Data-parallel ranks: a replica of several ranks (``--data-parallel-size``) ships each rank's events as the feed of
its own entry, ``dp_rank_key(id, rank)`` = ``"<id>/dp<rank>"``, numbered by the rank (so every rule above holds per
rank); the index treats each as a replica, and a router folds them back into their replica
(``router.strategies.fold_ranks``), as Dynamo's KV router keys blocks by (worker, dp_rank).

Bound: at most ``max_entries`` (block hash, replica) pairs and ``max_replicas`` replicas.
When full, the index refuses new entries for the replica being applied and counts them
as ``dropped_entries`` rather than evicting other replicas' entries: evicting would
silently corrupt views whose owners think they are in sync, refusing only affects the
replica whose batch overflowed, and it is flagged (``synced`` False) so it can resync.
"""

from __future__ import annotations

import operator
from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import msgpack
import numpy as np

from shared.errors import InputError, KvemuError

KINDS = ("stored", "removed", "cleared")
# The deepest memory level an event may name: levels are indexes, HBM 0 (untagged), host DRAM 1,
# SSD 2, ... (replica/core/tiers/levels.py names them; the index and the router never need to).
MAX_LEVEL = 15
MAX_HASH = 2**64 - 1
# Lua (Redis backend) counts in doubles, exact only below 2**53.
MAX_SEQ = 2**53 - 1
MAX_ID_LEN = 256
MAX_WIRE_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_ENTRIES = 4_000_000
DEFAULT_MAX_REPLICAS = 1024
# Cluster-wide counters both backends report in stats().
COUNTERS = ("batches", "applied_events", "duplicate_batches", "gaps", "epoch_changes", "dropped_entries")
_WIRE_FIELDS = ("replica_id", "epoch", "seq", "events")
_INT_ONLY = {int}


class IndexUnavailable(KvemuError):
    """The index backend cannot be reached; ``url`` names it (without credentials)."""

    def __init__(self, url: str, reason: str):
        super().__init__(f"prefix index at {url} is unavailable: {reason}")
        self.url = url


class IndexEvent(NamedTuple):
    """A change of residency: ``stored`` / ``removed`` hashes, or ``cleared``. Block pools emit it
    (as ``replica.core.cache.types.KvEvent``) and indexes apply it."""

    kind: str  # "stored" | "removed" | "cleared"
    hashes: tuple[int, ...]
    level: int = 0  # memory level, 0 (HBM) .. MAX_LEVEL; on the wire a third element, only when not HBM
    # KV cache group of a model of several (replica/core/cache/group_events.py): never on the index's wire, whose
    # events are one group's
    group: int = 0


@dataclass(slots=True)
class EventBatch:
    """Events from one replica; event i of the batch has sequence number ``seq + i``.

    Validated on construction, so a batch that exists is well-formed whether it came
    from a local block pool or from the wire.
    """

    replica_id: str
    epoch: str
    seq: int
    events: list[IndexEvent]

    def __post_init__(self) -> None:
        _check_text("replica_id", self.replica_id)
        _check_text("epoch", self.epoch)
        if type(self.seq) is not int or not 0 <= self.seq <= MAX_SEQ:
            raise InputError("seq", f"must be an integer in [0, 2**53), got {self.seq!r}")
        if not isinstance(self.events, (list, tuple)):
            raise InputError("events", f"must be a list, got {type(self.events).__name__}")
        self.events = [_check_event(i, ev) for i, ev in enumerate(self.events)]

    @property
    def last_seq(self) -> int:
        """Sequence number of the last event (``seq - 1`` for an empty heartbeat)."""
        return self.seq + len(self.events) - 1

    def to_wire(self) -> bytes:
        return msgpack.packb(
            {
                "replica_id": self.replica_id,
                "epoch": self.epoch,
                "seq": self.seq,
                "events": [event_to_wire(ev) for ev in self.events],
            },
            use_bin_type=True,
        )

    @classmethod
    def from_wire(cls, data: bytes | bytearray | memoryview) -> EventBatch:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InputError("batch", f"expected msgpack bytes, got {type(data).__name__}")
        if len(data) > MAX_WIRE_BYTES:
            raise InputError("batch", f"{len(data)} bytes exceeds the {MAX_WIRE_BYTES}-byte limit")
        try:
            obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
        except (ValueError, msgpack.UnpackException) as e:
            raise InputError("batch", f"not valid msgpack ({type(e).__name__}: {e})") from None
        if not isinstance(obj, dict):
            raise InputError("batch", f"expected a map, got {type(obj).__name__}")
        for key in obj:
            if key not in _WIRE_FIELDS:
                raise InputError(str(key), f"unknown field; expected {', '.join(_WIRE_FIELDS)}")
        for key in _WIRE_FIELDS:
            if key not in obj:
                raise InputError(key, "missing")
        return cls(obj["replica_id"], obj["epoch"], obj["seq"], obj["events"])


def event_to_wire(ev: IndexEvent) -> list:
    """``[kind, hashes]``, plus the level for a lower-level event (HBM events keep the old form)."""
    return [ev.kind, ev.hashes, ev.level] if ev.level else [ev.kind, ev.hashes]


def level_key(replica_id: str, level: int) -> str:
    """The overlap map's key for a replica's memory level below HBM: ``"<id>#1"`` (host DRAM), ``"<id>#2"``, ..."""
    return f"{replica_id}#{level}"


DP_RANK_SEP = "/dp"


def dp_rank_key(replica_id: str, rank: int) -> str:
    """The index's entry for data-parallel rank ``rank`` of a replica (``"<id>/dp<rank>"``): each rank holds its own
    blocks, as Dynamo's KV router keys a worker's blocks by (worker, dp_rank). A replica of one rank keeps its id."""
    return f"{replica_id}{DP_RANK_SEP}{rank}"


def split_dp_rank(key: str) -> tuple[str, int | None]:
    """``dp_rank_key``'s inverse: (replica id, rank), or (key, None) for an entry that names no rank."""
    replica_id, sep, rank = key.rpartition(DP_RANK_SEP)
    if not sep or not rank.isdigit() or not replica_id:
        return key, None
    return replica_id, int(rank)


def lower_overlap(replica_id: str, hashes: Sequence[int], start: int,
                  levels: Sequence[Container[int]]) -> dict[str, int]:
    """``lower_run_counts`` under ``level_key`` (zero counts omitted): what an index answers a router."""
    counts = lower_run_counts(hashes, start, levels)
    return {level_key(replica_id, k): n for k, n in enumerate(counts, 1) if n}


def lower_run_counts(hashes: Sequence[int], start: int, levels: Sequence[Container[int]]) -> list[int]:
    """The run of ``hashes`` from ``start`` (the HBM prefix) that the levels below HBM hold
    (``levels[k]``: what level k + 1 holds; the upper level looked up first), counted per level.
    The one definition: the simulator asks its level pools (or their compiled twin,
    ``replica.core.compiled.pool.KernelLevels``), the indexes their level sets."""
    counts = [0] * len(levels)
    for i in range(start, len(hashes)):
        h = hashes[i]
        for k, held in enumerate(levels):
            if h in held:
                counts[k] += 1
                break
        else:
            break
    return counts


EMPTY: frozenset[int] = frozenset()


def store_levels(lower: Sequence[Container[int]], store: Container[int], level: int) -> list[Container[int]]:
    """A replica's own levels below HBM (``lower[k]``: level k + 1) with a shared store at index ``level`` (the
    last): the list ``lower_run_counts`` walks for a replica a store serves (levels the replica lacks, empty)."""
    own = list(lower[:level - 1])
    return [*own, *([EMPTY] * (level - 1 - len(own))), store]


@dataclass(frozen=True, slots=True)
class StoreScope:
    """A shared store's feed (``store_id``) and whom it serves: ``level``, its index below HBM in each replica's
    hierarchy (the last: one more than the replicas' configured levels, 3 after host DRAM and SSD), and
    ``replicas`` (empty: every replica the index knows; else a scope group)."""

    store_id: str
    level: int
    replicas: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_text("store_id", self.store_id)
        if type(self.level) is not int or not 1 <= self.level <= MAX_LEVEL:
            raise InputError("level", f"a shared store's level must be 1..{MAX_LEVEL}, got {self.level!r}")
        if not isinstance(self.replicas, tuple):
            raise InputError("replicas", f"must be a tuple of replica ids, got {type(self.replicas).__name__}")
        for rid in self.replicas:
            _check_text("replicas", rid)
            if "," in rid:
                raise InputError("replicas", f"a replica id served by a store has no comma, got {rid!r}")
        if self.store_id in self.replicas:
            raise InputError("replicas", f"store {self.store_id!r} cannot serve itself")


def lower_counts(blocks: Sequence[int]) -> tuple[int, ...]:
    """Blocks per level below HBM, level 1 first, without trailing zeros (both backends' ``lower_blocks``)."""
    counts = list(blocks)
    while counts and not counts[-1]:
        counts.pop()
    return tuple(counts)


def _check_text(field: str, value: Any) -> None:
    if not isinstance(value, str):
        raise InputError(field, f"must be a string, got {type(value).__name__}")
    if not 0 < len(value) <= MAX_ID_LEN:
        raise InputError(field, f"must be 1..{MAX_ID_LEN} characters long")


def _check_event(i: int, ev: Any) -> IndexEvent:
    where = f"events[{i}]"
    # a pool's own event (an IndexEvent) has a fourth field, its KV cache group, which the index does not keep
    if not isinstance(ev, (list, tuple)) or not 2 <= len(ev) <= (4 if isinstance(ev, IndexEvent) else 3):
        raise InputError(where, "must be a [kind, hashes] pair or a [kind, hashes, level] triple")
    kind, hashes = ev[0], ev[1]
    if kind not in KINDS:
        raise InputError(f"{where}.kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    tier = ev[2] if len(ev) >= 3 else 0
    if type(tier) is not int or not 0 <= tier <= MAX_LEVEL or (tier and kind == "cleared"):
        raise InputError(f"{where}.level", f"must be a memory level 1..{MAX_LEVEL} on a stored or removed event "
                                           f"(cleared clears every level), got {tier!r}")
    if isinstance(hashes, np.ndarray):  # hashes straight from a trace or hashing.block_hashes
        hashes = hashes.tolist()
    if not isinstance(hashes, (list, tuple)):
        raise InputError(f"{where}.hashes", f"must be a list, got {type(hashes).__name__}")
    if kind == "cleared" and hashes:
        raise InputError(f"{where}.hashes", "a cleared event carries no hashes")
    if not hashes:
        return IndexEvent(kind, (), tier)
    # Fast path: plain ints in range, checked with C-level loops (this runs per batch).
    if set(map(type, hashes)) == _INT_ONLY and min(hashes) >= 0 and max(hashes) <= MAX_HASH:
        return IndexEvent(kind, tuple(hashes), tier)
    return IndexEvent(kind, tuple(_check_hash(f"{where}.hashes[{j}]", h) for j, h in enumerate(hashes)), tier)


def _check_hash(field: str, h: Any) -> int:
    if isinstance(h, bool):
        raise InputError(field, "must be an integer, got bool")
    try:
        v = operator.index(h)  # accepts numpy integers, rejects floats and strings
    except TypeError:
        raise InputError(field, f"must be an integer, got {type(h).__name__}") from None
    if not 0 <= v <= MAX_HASH:
        raise InputError(field, f"must be a 64-bit unsigned integer, got {v}")
    return v


@dataclass(slots=True, frozen=True)
class ApplyResult:
    applied: int  # events applied (0 for a duplicate batch)
    duplicate: bool  # the whole batch had been seen already and was ignored
    reset: str | None  # "epoch" or "gap": the replica's entries were cleared first
    dropped_entries: int  # new entries refused because the index is full
    synced: bool  # False while the index knows it misses some of this replica's blocks


@dataclass(slots=True, frozen=True)
class ReplicaIndexState:
    epoch: str
    last_seq: int
    blocks: int
    synced: bool
    gaps: int
    epoch_changes: int
    duplicate_batches: int
    dropped_entries: int
    applied_events: int
    # blocks each level below HBM holds, level 1 first, without trailing zeros (``blocks`` counts HBM)
    lower_blocks: tuple[int, ...] = ()


@runtime_checkable
class PrefixIndex(Protocol):
    """Where each replica's blocks are.  Async so a networked backend fits; every
    structure behind it is bounded."""

    backend: str

    async def apply(self, batch: EventBatch) -> ApplyResult: ...

    async def lookup(self, hashes: Sequence[int]) -> dict[str, int]:
        """Per replica, the length of the longest consecutive prefix of ``hashes`` it
        holds in HBM; replicas holding none of it are omitted. For a replica with lower
        levels, ``"<id>#1"``, ``"<id>#2"``, ... (``level_key``) count the blocks of the run
        right after that prefix which each level holds (the upper level first; the run ends
        at a block none holds); zero counts are omitted."""
        ...

    async def add_store(self, scope: StoreScope) -> None:
        """Declare ``scope.store_id``'s feed a shared store's (its blocks one set, answered for the replicas it
        serves; see the module docstring). Entries it had as a replica are cleared; idempotent."""
        ...

    async def clear_replica(self, replica_id: str) -> int:
        """Forget a replica (entries, epoch, sequence); returns how many blocks it had."""
        ...

    async def replicas(self) -> dict[str, ReplicaIndexState]: ...

    async def stats(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...
