"""In-process prefix index: block hash -> bitmask of replica slots.

Block hashes are chained, so a hash already names its whole prefix and a flat map is
enough (no radix tree).  A lookup walks the prompt's hashes once, AND-ing the candidate
mask; a replica's prefix length is the position where its bit first drops out.  Lower
memory levels (1 host DRAM, 2 SSD, ...) are plain per-replica sets: after the HBM walk, each replica that
has any walks on from its HBM prefix, as the simulator's ``TierStack.lower_overlap`` does. A shared
store (``add_store``) is a feed like a replica's whose blocks are one plain set (no bit in the table):
each replica it serves walks its own levels and then the store's set.  Every
method is synchronous underneath (``*_sync``, for the virtual-time simulator); the async
methods only wrap them, so they never yield and each call is atomic on the event loop.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from shared.errors import InputError
from shared.index.base import (
    COUNTERS,
    DEFAULT_MAX_ENTRIES,
    DEFAULT_MAX_REPLICAS,
    ApplyResult,
    EventBatch,
    IndexEvent,
    ReplicaIndexState,
    StoreScope,
    lower_counts,
    lower_overlap,
    store_levels,
)
from shared.validate import check_positive_int


class _Replica:
    __slots__ = ("replica_id", "slot", "bit", "epoch", "last_seq", "held", "lower", "synced", "store",
                 "gaps", "epoch_changes", "duplicate_batches", "dropped_entries", "applied_events")

    def __init__(self, replica_id: str, slot: int, epoch: str) -> None:
        self.replica_id = replica_id
        self.slot = slot
        self.bit = 1 << slot
        self.epoch = epoch
        self.last_seq = -1
        self.held: set[int] = set()
        self.lower: list[set[int]] = []  # lower[k]: the blocks of level k + 1 (grown as levels appear)
        self.synced = True
        self.store = False  # a shared store's feed: ``held`` is its blocks, with no bit in the table
        self.gaps = self.epoch_changes = self.duplicate_batches = 0
        self.dropped_entries = self.applied_events = 0


class MemoryIndex:
    backend = "memory"

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES,
                 max_replicas: int = DEFAULT_MAX_REPLICAS) -> None:
        check_positive_int("max_entries", max_entries)
        check_positive_int("max_replicas", max_replicas)
        self.max_entries = max_entries
        self.max_replicas = max_replicas
        self._table: dict[int, int] = {}  # block hash -> bitmask of replica slots
        self._reps: dict[str, _Replica] = {}
        self._names: list[str | None] = []  # slot -> replica id
        self._free: list[int] = []  # heap: reuse low slots so masks stay small ints
        self._tiered: dict[str, _Replica] = {}  # replicas holding blocks in a lower tier
        self._entries = 0
        self._counters = dict.fromkeys((*COUNTERS, "lookups"), 0)
        self._stores: dict[str, StoreScope] = {}  # shared stores, in the order declared
        self._served: dict[str, tuple[_Replica, int]] | None = None  # replica id -> (its store, level); lazily

    # ---- async protocol ------------------------------------------------------------
    async def apply(self, batch: EventBatch) -> ApplyResult:
        return self.apply_sync(batch)

    async def lookup(self, hashes: Sequence[int]) -> dict[str, int]:
        return self.lookup_sync(hashes)

    async def clear_replica(self, replica_id: str) -> int:
        return self.clear_replica_sync(replica_id)

    async def add_store(self, scope: StoreScope) -> None:
        self.add_store_sync(scope)

    async def replicas(self) -> dict[str, ReplicaIndexState]:
        return self.replicas_sync()

    async def stats(self) -> dict[str, Any]:
        return self.stats_sync()

    async def close(self) -> None:
        return None

    # ---- synchronous core ------------------------------------------------------------
    def apply_sync(self, batch: EventBatch) -> ApplyResult:
        c = self._counters
        c["batches"] += 1
        rep = self._reps.get(batch.replica_id)
        reset = None
        skip = 0
        if rep is None or rep.epoch != batch.epoch:
            if rep is None:
                rep = self._register(batch.replica_id, batch.epoch)
            else:
                self._drop_entries(rep)
                rep.epoch = batch.epoch
                reset = "epoch"
                rep.epoch_changes += 1
                c["epoch_changes"] += 1
            # A fresh view is complete only if the replica's stream starts here.
            rep.synced = batch.seq == 0
        elif batch.seq > rep.last_seq + 1:
            self._drop_entries(rep)
            reset = "gap"
            rep.synced = False
            rep.gaps += 1
            c["gaps"] += 1
        elif batch.seq <= rep.last_seq and batch.last_seq <= rep.last_seq:
            rep.duplicate_batches += 1
            c["duplicate_batches"] += 1
            return ApplyResult(0, True, None, 0, rep.synced)
        else:
            skip = rep.last_seq + 1 - batch.seq  # overlap with what was already applied
        dropped = 0
        events = batch.events if skip <= 0 else batch.events[skip:]
        for ev in events:
            dropped += self._apply_event(rep, ev)
        rep.last_seq = batch.last_seq
        rep.applied_events += len(events)
        c["applied_events"] += len(events)
        if dropped:
            rep.dropped_entries += dropped
            c["dropped_entries"] += dropped
        return ApplyResult(len(events), False, reset, dropped, rep.synced)

    def lookup_sync(self, hashes: Sequence[int]) -> dict[str, int]:
        self._counters["lookups"] += 1
        if len(hashes) == 0:
            return {}
        out = self._hbm_prefixes(hashes)
        served = self._served_by() if self._stores else {}
        if self._tiered:
            for rid, rep in self._tiered.items():
                if rid not in served:  # a served replica walks its levels with its store's below
                    out.update(lower_overlap(rid, hashes, out.get(rid, 0), rep.lower))
        n = len(hashes)
        for rid, (store, level) in served.items():
            start = out.get(rid, 0)
            if start >= n:
                continue
            own = self._reps.get(rid)
            levels = store_levels(own.lower if own is not None else (), store.held, level)
            h = hashes[start]
            if any(h in held for held in levels):  # most replicas hold nothing after their prefix: no walk
                out.update(lower_overlap(rid, hashes, start, levels))
        return out

    def add_store_sync(self, scope: StoreScope) -> None:
        rep = self._reps.get(scope.store_id)
        if rep is not None and not rep.store:  # known as a replica until now: its entries were a replica's
            self._drop_entries(rep)
            rep.store, rep.synced = True, False
        self._stores[scope.store_id] = scope
        self._served = None

    def _served_by(self) -> dict[str, tuple[_Replica, int]]:
        """Each replica a store serves (the first declared that does), with that store's feed and level."""
        if self._served is None:
            served: dict[str, tuple[_Replica, int]] = {}
            for scope in self._stores.values():
                store = self._reps.get(scope.store_id)
                if store is None:
                    continue
                ids = scope.replicas or [rid for rid, r in self._reps.items() if not r.store]
                for rid in ids:
                    served.setdefault(rid, (store, scope.level))
            self._served = served
        return self._served

    def _hbm_prefixes(self, hashes: Sequence[int]) -> dict[str, int]:
        get = self._table.get
        cand = get(hashes[0], 0)
        out: dict[str, int] = {}
        if not cand:
            return out
        for i in range(1, len(hashes)):
            m = cand & get(hashes[i], 0)
            if m != cand:
                self._emit(out, cand ^ m, i)
                if not m:
                    return out
                cand = m
        self._emit(out, cand, len(hashes))
        return out

    def clear_replica_sync(self, replica_id: str) -> int:
        rep = self._reps.pop(replica_id, None)
        if rep is None:
            return 0
        blocks = len(rep.held)
        self._drop_entries(rep)
        self._names[rep.slot] = None
        heapq.heappush(self._free, rep.slot)
        self._served = None
        return blocks

    def replicas_sync(self) -> dict[str, ReplicaIndexState]:
        return {
            rid: ReplicaIndexState(r.epoch, r.last_seq, len(r.held), r.synced, r.gaps, r.epoch_changes,
                                   r.duplicate_batches, r.dropped_entries, r.applied_events,
                                   lower_counts([len(held) for held in r.lower]))
            for rid, r in self._reps.items()
        }

    def stats_sync(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "replicas": len(self._reps),
            "entries": self._entries,
            "block_hashes": len(self._table),
            "max_entries": self.max_entries,
            "max_replicas": self.max_replicas,
            **self._counters,
        }

    # ---- internals --------------------------------------------------------------------
    def _emit(self, out: dict[str, int], mask: int, length: int) -> None:
        names = self._names
        while mask:
            low = mask & -mask
            out[names[low.bit_length() - 1]] = length  # type: ignore[index]  # set bits are live slots
            mask ^= low

    def _register(self, replica_id: str, epoch: str) -> _Replica:
        if len(self._reps) >= self.max_replicas:
            raise InputError("replica_id", f"index already tracks max_replicas={self.max_replicas} replicas; "
                                           f"clear_replica() ones that are gone")
        if self._free:
            slot = heapq.heappop(self._free)
            self._names[slot] = replica_id
        else:
            slot = len(self._names)
            self._names.append(replica_id)
        rep = self._reps[replica_id] = _Replica(replica_id, slot, epoch)
        rep.store = replica_id in self._stores
        self._served = None
        return rep

    def _apply_event(self, rep: _Replica, ev: IndexEvent) -> int:
        """Apply one event; returns how many new entries were refused for lack of room."""
        if rep.store:
            return self._apply_store(rep, ev)
        if ev.level:
            return self._apply_lower(rep, ev)
        table = self._table
        if ev.kind == "stored":
            new, dropped = self._admit(rep, rep.held, ev.hashes)
            bit = rep.bit
            for h in new:
                table[h] = table.get(h, 0) | bit
            return dropped
        if ev.kind == "removed":
            held = rep.held
            keep = ~rep.bit
            for h in ev.hashes:
                if h in held:
                    held.discard(h)
                    self._unset(table, h, keep)
            return 0
        self._drop_entries(rep)  # cleared: the replica will re-send what it still holds
        rep.synced = True
        return 0

    def _apply_store(self, rep: _Replica, ev: IndexEvent) -> int:
        """A shared store's event (any level it names is the store's): its one set, no bit in the table."""
        held = rep.held
        if ev.kind == "stored":
            return self._admit(rep, held, ev.hashes)[1]
        if ev.kind == "removed":
            before = len(held)
            held.difference_update(ev.hashes)
            self._entries -= before - len(held)
            return 0
        self._drop_entries(rep)
        rep.synced = True
        return 0

    def _apply_lower(self, rep: _Replica, ev: IndexEvent) -> int:
        """A lower level's event: that level's set only (lookups walk it after the HBM prefix)."""
        lower = rep.lower
        while len(lower) < ev.level:
            lower.append(set())
        held = lower[ev.level - 1]
        if ev.kind == "removed":
            before = len(held)
            held.difference_update(ev.hashes)
            self._entries -= before - len(held)
            if not any(lower):
                self._tiered.pop(rep.replica_id, None)
            return 0
        _, dropped = self._admit(rep, held, ev.hashes)
        if held:
            self._tiered[rep.replica_id] = rep
        return dropped

    def _admit(self, rep: _Replica, held: set[int], hashes: tuple[int, ...]) -> tuple[list[int], int]:
        """Add the hashes ``held`` lacks while the bound allows: (those added, how many refused)."""
        new = [h for h in dict.fromkeys(hashes) if h not in held]
        room = self.max_entries - self._entries
        dropped = max(0, len(new) - room)
        if dropped:
            del new[room:]
            rep.synced = False
        held.update(new)
        self._entries += len(new)
        return new, dropped

    def _drop_entries(self, rep: _Replica) -> None:
        if rep.store:
            self._entries -= len(rep.held)
            rep.held = set()
            return
        table = self._table
        keep = ~rep.bit
        for h in rep.held:
            self._unset(table, h, keep)
        rep.held = set()
        self._entries -= sum(map(len, rep.lower))
        rep.lower = []
        self._tiered.pop(rep.replica_id, None)

    def _unset(self, table: dict[int, int], h: int, keep: int) -> None:
        m = table[h] & keep
        if m:
            table[h] = m
        else:
            del table[h]
        self._entries -= 1

