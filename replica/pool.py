"""The block pool: one emulated GPU's KV blocks.

Pure and synchronous. It owns residency (hash -> owning session), reference counts
(blocks of running requests are pinned and never evicted), the policy hooks, the
per-replica metrics and the ``stored`` / ``removed`` / ``cleared`` events that a thin
async layer ships to the prefix index. The live replica and the simulator both use it.

Hit modes (DESIGN.md): ``prefix`` reuses blocks up to the first miss; ``holes`` reuses
every resident block and recomputes the gaps. In ``prefix`` mode resident blocks past the
first miss are recomputed (not hits) but count as accessed for the policy: the new KV
replaces the stale copy under the same hash.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

from replica.metrics import PoolMetrics
from replica.policies.base import Access, EvictionPolicy
from shared.errors import InputError, KvemuError

HIT_MODES = ("prefix", "holes")


class PoolCapacityError(InputError):
    """A request needs more blocks than the whole pool holds."""

    def __init__(self, need: int, capacity: int):
        super().__init__("prompt", f"needs {need} KV blocks but the pool holds only {capacity}")
        self.need = need


class PoolBusyError(KvemuError):
    """Not enough unpinned blocks right now; a scheduler should wait and retry."""


class KvEvent(NamedTuple):
    kind: str  # "stored" | "removed" | "cleared"
    hashes: tuple[int, ...]


@dataclass(slots=True)
class Allocation:
    """What one request got from the pool; pass it back to ``release``."""

    hashes: Sequence[int]
    hit_idx: list[int]  # indices of reused blocks (after hit-mode rules)
    new_idx: list[int]  # indices of blocks inserted for this request
    touched_idx: list[int]  # resident blocks pinned by this request (superset of hit_idx)
    session: str | None
    holes: int = 0
    hole_lengths: list[int] = field(default_factory=list)

    @property
    def hit_blocks(self) -> int:
        return len(self.hit_idx)

    @property
    def prefix_blocks(self) -> int:
        """Length of the leading run of reused blocks."""
        n = 0
        for i in self.hit_idx:
            if i != n:
                break
            n += 1
        return n


class BlockPool:
    def __init__(
        self,
        capacity_blocks: int,
        policy: EvictionPolicy,
        *,
        block_size: int = 16,
        hit_mode: str = "holes",
        metrics: PoolMetrics | None = None,
        emit_events: bool = True,
    ) -> None:
        if isinstance(capacity_blocks, bool) or not isinstance(capacity_blocks, int) or capacity_blocks <= 0:
            raise InputError("capacity_blocks", f"must be a positive integer, got {capacity_blocks!r}")
        if hit_mode not in HIT_MODES:
            raise InputError("hit_mode", f"must be one of {', '.join(HIT_MODES)}, got {hit_mode!r}")
        self.capacity = capacity_blocks
        self.block_size = block_size
        self.hit_mode = hit_mode
        self.resident: dict[int, str | None] = {}
        self._refs: dict[int, int] = {}
        self.metrics = metrics if metrics is not None else PoolMetrics(block_size=block_size)
        self.emit_events = emit_events
        self.events: list[KvEvent] = []
        self.footprint: dict[str | None, int] = {}
        self._reused: set[int] = set()
        self.policy = policy
        policy.bind(self)

    # ---- queries (no side effects) -----------------------------------------------
    def pinned_set(self) -> dict[int, int]:
        return self._refs

    def is_pinned(self, h: int) -> bool:
        return h in self._refs

    @property
    def used(self) -> int:
        return len(self.resident)

    @property
    def evictable(self) -> int:
        return len(self.resident) - len(self._refs)

    def usage(self) -> float:
        return len(self.resident) / self.capacity

    def block_cost(self, index: int) -> float:
        """Recompute cost of a block at depth ``index`` (for cost-aware policies)."""
        return self.metrics.block_cost(index)

    def prefix_match(self, hashes: Sequence[int]) -> int:
        """Number of leading blocks resident (what a router's index would report)."""
        res = self.resident
        n = 0
        for h in hashes:
            if h not in res:
                break
            n += 1
        return n

    def cached_blocks(self, hashes: Sequence[int]) -> int:
        """Blocks this pool would reuse for ``hashes`` under its hit mode."""
        if self.hit_mode == "prefix":
            return self.prefix_match(hashes)
        res = self.resident
        return sum(1 for h in hashes if h in res)

    # ---- request lifecycle --------------------------------------------------------
    def acquire(
        self,
        hashes: Sequence[int],
        *,
        session: str | None = None,
        now: float = 0.0,
        input_tokens: int | None = None,
        next_use: Sequence[float] | None = None,
    ) -> Allocation:
        """Pin the request's resident blocks, allocate the rest (evicting through the policy)."""
        n = len(hashes)
        if n > self.capacity:
            raise PoolCapacityError(n, self.capacity)
        res = self.resident
        touched = [i for i, h in enumerate(hashes) if h in res]
        need = n - len(touched)
        free = self.capacity - len(res)
        if need > free:
            self._check_evictable(hashes, touched, need - free)
        self._pin(hashes, touched)
        if need > free:
            self._evict(need - free)
        hit_idx = touched if self.hit_mode == "holes" else _leading_run(touched)
        new_idx = _complement(touched, n) if touched else list(range(n))
        self._insert(hashes, new_idx, session)
        alloc = Allocation(hashes, hit_idx, new_idx, touched, session)
        if hit_idx:
            self._reused.update([hashes[i] for i in hit_idx])
            if self.hit_mode == "holes":
                alloc.holes, alloc.hole_lengths = _holes(hit_idx)
        self.policy.on_access(Access(hashes, touched, new_idx, now, session, next_use))
        self.metrics.record_request(alloc, n, input_tokens, now)
        return alloc

    def release(self, alloc: Allocation, now: float = 0.0) -> None:
        refs = self._refs
        hashes = alloc.hashes
        for i in alloc.touched_idx:
            _unpin(refs, hashes[i])
        for i in alloc.new_idx:
            _unpin(refs, hashes[i])
        self.policy.on_release(hashes, now)

    def serve(self, hashes: Sequence[int], **kw) -> Allocation:
        """Acquire and release at once: a request served alone (the simulator's path)."""
        alloc = self.acquire(hashes, **kw)
        self.release(alloc, kw.get("now", 0.0))
        return alloc

    # ---- administration -----------------------------------------------------------
    def reset(self) -> int:
        """Drop every unpinned block (vLLM's reset_prefix_cache); returns how many."""
        dropped = [h for h in self.resident if h not in self._refs]
        for h in dropped:
            self.policy.on_remove(h)
            self._drop(h)
        if not self._refs:
            self.policy.clear()
        if self.emit_events:
            self.events.append(KvEvent("cleared", ()))
            if self.resident:
                self.events.append(KvEvent("stored", tuple(self.resident)))
        return len(dropped)

    def set_policy(self, policy: EvictionPolicy, now: float = 0.0) -> None:
        """Switch policy live, keeping resident blocks: the new one learns them in insertion order."""
        policy.bind(self)
        hashes = list(self.resident)
        if hashes:
            policy.on_access(Access(hashes, [], list(range(len(hashes))), now, None, None))
            # on_release treats its list as one request's blocks (the last is evicted first):
            # reversed, the oldest resident block becomes the first victim.
            policy.on_release([h for h in reversed(hashes) if h not in self._refs], now)
        self.policy = policy

    def top_sessions(self, k: int = 10) -> list[tuple[str | None, int]]:
        return heapq.nlargest(k, self.footprint.items(), key=lambda kv: kv[1])

    def stats(self, top_k: int = 10) -> dict:
        out = {
            "policy": self.policy.describe(),
            "capacity_blocks": self.capacity,
            "block_size": self.block_size,
            "hit_mode": self.hit_mode,
            "usage": self.usage(),
            "pinned_blocks": len(self._refs),
            "sessions_resident": len(self.footprint),
            "top_sessions": [{"session": s, "blocks": b} for s, b in self.top_sessions(top_k)],
        }
        out.update(self.metrics.snapshot(len(self.resident), len(self.resident) - len(self._reused)))
        return out

    def drain_events(self) -> list[KvEvent]:
        events, self.events = self.events, []
        return events

    # ---- internals ----------------------------------------------------------------
    def _check_evictable(self, hashes, touched, shortfall: int) -> None:
        # Blocks this request reuses will be pinned, so they cannot be victims either.
        refs = self._refs
        newly_pinned = sum(1 for i in touched if hashes[i] not in refs)
        if self.evictable - newly_pinned < shortfall:
            raise PoolBusyError(
                f"need {shortfall} more free blocks, only {self.evictable - newly_pinned} evictable"
            )

    def _pin(self, hashes, idx) -> None:
        refs = self._refs
        for i in idx:
            h = hashes[i]
            refs[h] = refs.get(h, 0) + 1

    def _insert(self, hashes, new_idx, session) -> None:
        res = self.resident
        refs = self._refs
        for i in new_idx:
            h = hashes[i]
            res[h] = session
            refs[h] = 1
        if new_idx:
            fp = self.footprint
            fp[session] = fp.get(session, 0) + len(new_idx)
            if self.emit_events:
                self.events.append(KvEvent("stored", tuple(hashes[i] for i in new_idx)))
            self.metrics.inserted += len(new_idx)

    def _evict(self, count: int) -> None:
        victims = self.policy.victims(count)
        for h in victims:
            self._drop(h)
        m = self.metrics
        m.evictions += len(victims)
        if self.emit_events and victims:
            self.events.append(KvEvent("removed", tuple(victims)))

    def _drop(self, h: int) -> None:
        owner = self.resident.pop(h)
        fp = self.footprint
        left = fp[owner] - 1
        if left:
            fp[owner] = left
        else:
            del fp[owner]
        if h in self._reused:
            self._reused.discard(h)
        else:
            self.metrics.one_hit_evictions += 1


def _unpin(refs: dict[int, int], h: int) -> None:
    left = refs[h] - 1
    if left:
        refs[h] = left
    else:
        del refs[h]


def _leading_run(idx: list[int]) -> list[int]:
    n = 0
    for i in idx:
        if i != n:
            break
        n += 1
    return idx[:n]


def _complement(idx: list[int], n: int) -> list[int]:
    present = set(idx)
    return [i for i in range(n) if i not in present]


def _holes(hit_idx: list[int]) -> tuple[int, list[int]]:
    """Gaps of recomputed blocks that lie before a reused block."""
    lengths = []
    prev = -1
    for i in hit_idx:
        if i > prev + 1:
            lengths.append(i - prev - 1)
        prev = i
    return len(lengths), lengths
