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

Bound: at most ``max_entries`` (block hash, replica) pairs and ``max_replicas`` replicas.
When full, the index refuses new entries for the replica being applied and counts them
as ``dropped_entries`` rather than evicting other replicas' entries: evicting would
silently corrupt views whose owners think they are in sync, refusing only affects the
replica whose batch overflowed, and it is flagged (``synced`` False) so it can resync.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol, runtime_checkable

import msgpack
import numpy as np

from shared.errors import InputError, KvemuError

KINDS = ("stored", "removed", "cleared")
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
    (as ``replica.core.types.KvEvent``) and indexes apply it."""

    kind: str  # "stored" | "removed" | "cleared"
    hashes: tuple[int, ...]


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
                "events": [[ev.kind, ev.hashes] for ev in self.events],
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


def check_positive_int(field: str, value: Any) -> None:
    if type(value) is not int or value < 1:
        raise InputError(field, f"must be a positive integer, got {value!r}")


def _check_text(field: str, value: Any) -> None:
    if not isinstance(value, str):
        raise InputError(field, f"must be a string, got {type(value).__name__}")
    if not 0 < len(value) <= MAX_ID_LEN:
        raise InputError(field, f"must be 1..{MAX_ID_LEN} characters long")


def _check_event(i: int, ev: Any) -> IndexEvent:
    where = f"events[{i}]"
    if not isinstance(ev, (list, tuple)) or len(ev) != 2:
        raise InputError(where, "must be a [kind, hashes] pair")
    kind, hashes = ev
    if kind not in KINDS:
        raise InputError(f"{where}.kind", f"must be one of {', '.join(KINDS)}, got {kind!r}")
    if isinstance(hashes, np.ndarray):  # hashes straight from a trace or hashing.block_hashes
        hashes = hashes.tolist()
    if not isinstance(hashes, (list, tuple)):
        raise InputError(f"{where}.hashes", f"must be a list, got {type(hashes).__name__}")
    if kind == "cleared" and hashes:
        raise InputError(f"{where}.hashes", "a cleared event carries no hashes")
    if not hashes:
        return IndexEvent(kind, ())
    # Fast path: plain ints in range, checked with C-level loops (this runs per batch).
    if set(map(type, hashes)) == _INT_ONLY and min(hashes) >= 0 and max(hashes) <= MAX_HASH:
        return IndexEvent(kind, tuple(hashes))
    return IndexEvent(kind, tuple(_check_hash(f"{where}.hashes[{j}]", h) for j, h in enumerate(hashes)))


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


@runtime_checkable
class PrefixIndex(Protocol):
    """Where each replica's blocks are.  Async so a networked backend fits; every
    structure behind it is bounded."""

    backend: str

    async def apply(self, batch: EventBatch) -> ApplyResult: ...

    async def lookup(self, hashes: Sequence[int]) -> dict[str, int]:
        """Per replica, the length of the longest consecutive prefix of ``hashes`` it
        holds; replicas holding none of it are omitted."""
        ...

    async def clear_replica(self, replica_id: str) -> int:
        """Forget a replica (entries, epoch, sequence); returns how many blocks it had."""
        ...

    async def replicas(self) -> dict[str, ReplicaIndexState]: ...

    async def stats(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...
