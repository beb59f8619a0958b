"""Block-level LRU with vLLM V1 free-queue semantics.

Evictable blocks sit in one ordered queue, the head evicted first. A request's blocks
are pinned while it runs and re-queued at the tail when it finishes, in reverse depth
order: among the blocks one request frees, the deepest goes first (vLLM frees
``reversed(blocks)`` so a prompt's tail, the least likely to be shared, is evicted first).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from itertools import islice, repeat

from replica.core.cache.policies.base import Access, EvictionPolicy


class LRUPolicy(EvictionPolicy):
    name = "lru"

    def __init__(self) -> None:
        self._queue: OrderedDict[int, None] = OrderedDict()

    def on_access(self, acc: Access) -> None:
        # Hits stay queued while pinned (no removal per hit): the pool skips them if they reach
        # the head, and on_release re-queues them at the tail.
        pass

    def on_release(self, hashes: Sequence[int], now: float) -> None:
        # Both steps run in C (no Python loop per block): drop the released blocks wherever they
        # sit in the order, then append them at the tail, deepest first.
        queue = self._queue
        _consume(map(queue.pop, hashes, repeat(None)))
        queue.update(zip(reversed(hashes), repeat(None)))

    def victims(self, need: int) -> list[int]:
        queue = self._queue
        out = list(islice(queue, need))
        _consume(map(queue.__delitem__, out))
        return out

    def on_remove(self, h: int) -> None:
        self._queue.pop(h, None)

    def clear(self) -> None:
        self._queue.clear()

    def age_order(self) -> list[int]:
        """Resident blocks, oldest first: the queue, then blocks never released (in use, so newest).

        O(resident); the adaptive policy calls it only when it switches away from LRU.
        """
        queue = self._queue
        return list(queue) + [h for h in self.ctx.owners if h not in queue]


def _consume(it) -> None:
    deque(it, maxlen=0)
