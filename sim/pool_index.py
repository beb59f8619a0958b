"""The simulator's prefix index where a pool is not compiled: the pools' own KV events applied to a
``MemoryIndex``, as the live router's embedded index applies the replicas' feeds. Compiled with the
simulator's loop (shared/compiled_modules.py), which syncs it after every step."""

from __future__ import annotations

from replica.core.cache.group_events import GroupKeys
from replica.core.cache.pool import BlockPool
from shared.index import EventBatch, MemoryIndex
from shared.index.base import DEFAULT_MAX_REPLICAS


class PoolIndex:
    """The pools' events in one index. A lookup then costs O(prompt) whatever the number of replicas (asking
    every pool would cost O(replicas x prompt))."""

    def __init__(self, replica_ids: list[str], capacity_blocks: int) -> None:
        self.index = MemoryIndex(max_entries=capacity_blocks * len(replica_ids) + 1,
                                 max_replicas=max(len(replica_ids), DEFAULT_MAX_REPLICAS))
        self._seq = dict.fromkeys(replica_ids, 0)

    def sync(self, replica_id: str, pool: BlockPool, groups: GroupKeys | None = None) -> None:
        """Apply what the pool changed since the last sync (call after anything that allocates); ``groups``: a
        model of several KV cache groups, whose index follows one group (replica/core/cache/group_events.py)."""
        if pool.events:
            events = pool.drain_events() if groups is None else groups.index_events(pool.drain_events())
            self.index.apply_sync(EventBatch(replica_id, "sim", self._seq[replica_id], events))
            self._seq[replica_id] += len(events)

    def lookup(self, hashes) -> dict[str, int]:
        return self.index.lookup_sync(hashes)
