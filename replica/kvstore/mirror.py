"""A replica's stand-in for the shared store (``MirrorStore``): what its ``TierStack`` runs on live.

The replica's core is pure and synchronous; the store is in another process (``service.py``). So the
stack's last level is a ``SharedStore`` whose membership is a *mirror* of the store's, fed by the store's
event feed (``client.py`` follows it, as a router follows replicas), and whose writes and reads are queued
here and shipped by the client after each engine step:

* ``admit_absent`` (a write): the full chunks the mirror does not hold enter it at once (optimistically: the
  store's answer takes back any it refused) and are queued; the blocks it returns cross this replica's NIC
  and its local view of the aggregate link, as in the simulator.
* ``acquire`` (a fetch planned from the mirror): queued as a read, which takes the store's read leases and
  crosses the store's aggregate link; the store's own evictions reach the mirror through the feed.
* ``apply``: the feed's ``stored`` / ``removed`` / ``cleared`` events.
* While the store is unreachable (``available`` False) the mirror is empty and takes no writes, so nothing is
  planned from the store; the replica carries on with its own levels.

``held`` and ``chunks`` are cleared in place, never replaced: the stack's level queries hold ``held``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from replica.core.cache.pool import Allocation, KvEvent
from replica.core.cache.types import Lookup
from replica.core.tiers.shared import SharedStore


@dataclass(slots=True)
class MirrorCounters:
    queued_writes: int = 0  # chunks queued for the store
    queued_reads: int = 0  # blocks queued for the store
    skipped_writes: int = 0  # chunks not written because the store was unreachable
    applied_events: int = 0


@dataclass(eq=False)
class MirrorStore(SharedStore):
    """See the module docstring; ``SharedStore``'s protocol, the store's membership."""

    available: bool = False
    writes: list[tuple[int, ...]] = field(default_factory=list)  # chunks to ship
    reads: list[int] = field(default_factory=list)  # blocks to ship
    notify: Callable[[], None] | None = None  # the client's wake-up, after something was queued
    mirror: MirrorCounters = field(default_factory=MirrorCounters)

    def admit_absent(self, hashes: Sequence[int], now: float = 0.0) -> list[int]:
        n = self.settings.chunk_blocks
        written: list[int] = []
        for i in range(0, len(hashes) - n + 1, n):
            chunk = tuple(hashes[i:i + n])
            key = chunk[-1]
            if key in self.chunks:
                continue
            if not self.available:
                self.mirror.skipped_writes += 1
                continue
            self._add(chunk)
            self.writes.append(chunk)
            written.extend(chunk)
        if written:
            self.mirror.queued_writes += len(written) // n
            self._notify()
        return written

    def acquire(self, lookup: Lookup) -> Allocation:
        held = [h for h in lookup.hashes if h in self.held]
        if held:
            self.reads.extend(held)
            self.mirror.queued_reads += len(held)
            self.counters.reads += len(dict.fromkeys(self.held[h] for h in held))
            self._notify()
        return Allocation(lookup.hashes, [], [], [], lookup.session)

    # ---- the feed ---------------------------------------------------------------------
    def apply(self, kind: str, hashes: Sequence[int]) -> None:
        self.mirror.applied_events += 1
        if kind == "cleared":
            self.clear()
        elif kind == "stored":
            n = self.settings.chunk_blocks
            for i in range(0, len(hashes) - n + 1, n):
                self._add(tuple(hashes[i:i + n]))
        elif kind == "removed":
            for h in hashes:
                key = self.held.pop(h, None)
                if key is not None:
                    self.chunks.pop(key, None)

    def refused(self, keys: Sequence[int]) -> None:
        """The store found no room for these chunks: they leave the mirror (unless the feed stored them since)."""
        for key in keys:
            for h in self.chunks.pop(key, ()):
                self.held.pop(h, None)

    def clear(self) -> None:
        self.held.clear()
        self.chunks.clear()

    def take(self) -> tuple[list[tuple[int, ...]], list[int]]:
        """The queued writes and reads, handed to the client."""
        writes, reads = self.writes, self.reads
        self.writes, self.reads = [], []
        return writes, reads

    def _add(self, chunk: tuple[int, ...]) -> None:
        key = chunk[-1]
        self.chunks[key] = chunk
        self.chunks.move_to_end(key)
        for h in chunk:
            self.held[h] = key

    def _notify(self) -> None:
        if self.notify is not None:
            self.notify()

    def drain_events(self) -> list[KvEvent]:
        return []  # the store publishes its own residency, not each replica

    def stats(self) -> dict:
        m = self.mirror
        return {"mirrored_blocks": self.used, "mirrored_chunks": len(self.chunks), "available": self.available,
                "queued_write_chunks": m.queued_writes, "queued_read_blocks": m.queued_reads,
                "skipped_write_chunks": m.skipped_writes, "applied_events": m.applied_events,
                "pending_writes": len(self.writes), "pending_reads": len(self.reads),
                "aggregate_link_bytes": self.link.bytes_moved}
