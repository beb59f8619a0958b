"""The block pool: one emulated GPU's KV blocks.

Pure and synchronous. It owns residency (hash -> owning session), reference counts
(blocks of running requests are pinned and never evicted), the policy hooks, the
per-replica metrics and the ``stored`` / ``removed`` / ``cleared`` events that a thin
async layer ships to the prefix index. The live replica and the simulator both use it.

Hit modes: ``prefix`` reuses blocks up to the first miss; ``holes`` reuses
every resident block and recomputes the gaps. In ``prefix`` mode resident blocks past the
first miss are recomputed (not hits) but count as accessed for the policy: the new KV
replaces the stale copy under the same hash.
"""

from __future__ import annotations

import heapq
from collections import _count_elements, deque  # type: ignore[attr-defined]  # C helper Counter uses
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import compress, filterfalse, repeat
from operator import not_, sub
from types import MappingProxyType

from replica.core.cache.costs import DepthCosts
from replica.core.cache.metrics import PoolMetrics
from replica.core.cache.policies.base import EvictionPolicy, hand_over
from replica.core.cache.types import ACQUIRE, FILL, RELEASE, SERVE, STORE, Access, Allocation, KvEvent, Lookup, PolicyContext, PoolOp
from shared.errors import InputError, KvemuError
from shared.validate import check_positive_int

__all__ = ["HIT_MODES", "Allocation", "BlockPool", "KvEvent", "PoolBusyError", "PoolCapacityError", "fill_picks"]

HIT_MODES = ("prefix", "holes")


class PoolCapacityError(InputError):
    """A request needs more blocks than the whole pool holds (``max_tokens``: once its output is in)."""

    def __init__(self, need: int, capacity: int, field: str = "prompt"):
        super().__init__(field, f"needs {need} KV blocks but the pool holds only {capacity}")
        self.need = need
        self.capacity = capacity


class PoolBusyError(KvemuError):
    """Not enough unpinned blocks right now; a scheduler should wait and retry."""


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
        block_cost: Callable[[int], float] | None = None,
        prefix_caching: bool = True,
    ) -> None:
        check_positive_int("capacity_blocks", capacity_blocks)
        if hit_mode not in HIT_MODES:
            raise InputError("hit_mode", f"must be one of {', '.join(HIT_MODES)}, got {hit_mode!r}")
        self.capacity = capacity_blocks
        self.block_size = block_size
        self.hit_mode = hit_mode
        # False: vLLM without --enable-prefix-caching. A request's blocks are all its own private
        # blocks while it runs (``_acquire_private``) and are freed when it ends: nothing is cached,
        # matched, stored, evicted or sent as an event, and the policy sees nothing.
        self.prefix_caching = prefix_caching
        self.resident: dict[int, str | None] = {}
        self._refs: dict[int, int] = {}
        self._pins = 0  # sum of the reference counts: release's one-request test without a pass over them
        self.metrics = metrics if metrics is not None else PoolMetrics(block_size=block_size)
        self.emit_events = emit_events
        self.events: list[KvEvent] = []
        # Blocks running requests hold outside the hash map: a prompt's partial last block and the
        # KV of generated tokens (vLLM allocates them as decoding fills blocks). They take room.
        self.private = 0
        self.footprint: dict[str | None, int] = {}
        self._reused: set[int] = set()
        # What cost-aware policies see comes from the cost model (``block_cost``), never from how
        # the metrics were configured; without one every block costs the same.
        costs = block_cost if block_cost is not None else DepthCosts()
        self.policy_context = PolicyContext(capacity_blocks, costs, MappingProxyType(self._refs),
                                            MappingProxyType(self.resident), hit_mode=hit_mode)
        self.policy = policy
        policy.bind(self.policy_context)
        # Told of every eviction's victims (a lower memory tier demotes them); None: they are gone.
        self.evicted_sink: Callable[[list[int]], None] | None = None

    # ---- queries (no side effects) -----------------------------------------------
    @property
    def now(self) -> float:
        """Time of the request being served (the latest seen): cost-aware victims() score at it."""
        return self.policy_context.now

    @property
    def pin_counts(self) -> Mapping[int, int]:
        """Read-only view: pinned hash -> number of running requests that hold it."""
        return self.policy_context.pinned

    @property
    def held(self) -> Mapping[int, str | None]:
        """What it holds, for membership tests (``h in held``): its resident map (the compiled twin's is its kernel)."""
        return self.resident

    def settle(self) -> BlockPool:
        """Itself, current (the compiled twin's ``settle`` writes its state into the pool it was made from)."""
        return self

    def is_pinned(self, h: int) -> bool:
        return h in self._refs

    def missing(self, hashes: Sequence[int]) -> list[int]:
        """The depths of the blocks of ``hashes`` not resident (what a lower tier may restore)."""
        resident = self.resident
        return [i for i, h in enumerate(hashes) if h not in resident]

    def absent(self, hashes: Sequence[int]) -> list[int]:
        """The hashes not resident, in order (what a lower tier would newly store)."""
        resident = self.resident
        return [h for h in hashes if h not in resident]

    def pins_of(self, hashes: Sequence[int]) -> list[int]:
        """How many running requests hold each of ``hashes`` (0: none, or not resident)."""
        get = self._refs.get
        return [get(h, 0) for h in hashes]

    @property
    def pinned(self) -> int:
        """Blocks held by running requests."""
        return len(self._refs)

    @property
    def used(self) -> int:
        return len(self.resident)

    @property
    def evictable(self) -> int:
        return len(self.resident) - len(self._refs)

    def usage(self) -> float:
        return (len(self.resident) + self.private) / self.capacity

    @property
    def free(self) -> int:
        """Blocks neither cached nor held: what an allocation gets without evicting."""
        return self.capacity - len(self.resident) - self.private

    @property
    def room(self) -> int:
        """Blocks a new allocation could get: free ones and evictable (unpinned) cached ones."""
        return self.capacity - len(self._refs) - self.private

    def take_private(self, n: int) -> None:
        """Allocate ``n`` unhashed blocks (evicting cached ones through the policy); PoolBusyError if
        fewer than ``n`` are free or evictable."""
        shortfall = n - self.free
        if shortfall > 0:
            self._check_evictable((), shortfall)
            self._evict(shortfall)
        self.private += n

    def free_private(self, n: int) -> None:
        self.private -= n

    def block_cost(self, index: int) -> float:
        """Recompute cost of a block at depth ``index``, as cost-aware policies see it."""
        return self.policy_context.block_cost(index)

    def prefix_match(self, hashes: Sequence[int]) -> int:
        """Number of leading blocks resident (what a router's index would report)."""
        # map + index run in C: several times faster than a Python loop on long prompts.
        try:
            return list(map(self.resident.__contains__, hashes)).index(False)
        except ValueError:
            return len(hashes)

    # ---- request lifecycle --------------------------------------------------------
    def acquire(self, lookup: Lookup) -> Allocation:
        """Pin the request's resident blocks, allocate the rest (evicting through the policy), and
        ``lookup.extra`` unhashed blocks (``take_private``) with them."""
        return self._allocate(lookup, hold=True)

    def _allocate(self, lookup: Lookup, hold: bool, kind: int = ACQUIRE) -> Allocation:
        """``hold``: pin the blocks until ``release``; otherwise (``serve`` with nothing pinned or
        private) they are only kept out of this request's own evictions. ``kind``: what a policy that
        observes the pool hears a held allocation as (``ACQUIRE``, or ``FILL``)."""
        if not self.prefix_caching:
            return self._acquire_private(lookup)
        hashes, session, now, extra, position = lookup.hashes, lookup.session, lookup.now, lookup.extra, lookup.position
        n = len(hashes)
        if n > self.capacity:
            raise PoolCapacityError(n, self.capacity)
        own = set(hashes)
        if len(own) != n:
            raise InputError("block_hashes", "a block hash repeats within one request; chained hashes never do")
        res = self.resident
        touched = list(compress(range(n), map(res.__contains__, hashes)))
        k = len(touched)
        if k == 0:
            new_idx, new_hashes, touched_hashes = list(range(n)), list(hashes), []
        elif touched[-1] == k - 1:  # the common case: a resident prefix, then new blocks
            new_idx, new_hashes, touched_hashes = list(range(k, n)), list(hashes[k:]), list(hashes[:k])
        else:
            new_idx = [i for i, h in enumerate(hashes) if h not in res]
            new_hashes = [hashes[i] for i in new_idx]
            touched_hashes = [hashes[i] for i in touched]
        ctx = self.policy_context
        if now > ctx.now:
            ctx.now = now
        if position is not None:
            ctx.position = position
        shortfall = n - k + extra - self.free
        if hold:
            if shortfall > 0:
                self._check_evictable(touched_hashes, shortfall)
            self._pin(touched_hashes)
        if shortfall > 0:  # unpinned: nothing else is pinned or private, so n <= capacity leaves enough
            self._evict(shortfall, None if hold else own.__contains__)
        self._insert(new_hashes, session, hold)
        self.private += extra
        alloc = self._allocation(hashes, touched, touched_hashes, new_idx, session)
        policy = self.policy
        policy.on_access(Access(hashes, touched, new_idx, now, session, lookup.next_use))
        if policy.observes_pool:
            policy.on_pool_op(PoolOp(kind if hold else SERVE, hashes, now, self.private, session))
        if lookup.record:  # a preempted request's re-admission is not another request for the hit ratios
            self.metrics.record_request(alloc, n, lookup.input_tokens, now)
        return alloc

    def _acquire_private(self, lookup: Lookup) -> Allocation:
        """Prefix caching off: every block of the request, and ``lookup.extra`` more, as private
        blocks (as decode KV's are), so two requests with the same prompt hold two copies. Nothing is
        cached, so none is a hit and none can be evicted to make room: PoolBusyError unless free."""
        hashes, now = lookup.hashes, lookup.now
        n = len(hashes)
        if n > self.capacity:
            raise PoolCapacityError(n, self.capacity)
        if n + lookup.extra > self.free:
            raise PoolBusyError(f"need {n + lookup.extra} free blocks, only {self.free} free")
        ctx = self.policy_context
        if now > ctx.now:
            ctx.now = now
        self.private += n + lookup.extra
        alloc = Allocation(hashes, [], list(range(n)), [], lookup.session, private=n)
        if lookup.record:
            self.metrics.record_request(alloc, n, lookup.input_tokens, now)
        return alloc

    def _allocation(self, hashes: Sequence[int], touched: list[int], touched_hashes: list[int], new_idx: list[int],
                    session: str | None) -> Allocation:
        """What the request got, after the hit-mode rules; its hits count as reused blocks."""
        if self.hit_mode == "holes":
            hit_idx, hit_hashes = touched, touched_hashes
        else:
            hit_idx = _leading_run(touched)
            hit_hashes = touched_hashes[: len(hit_idx)]
        alloc = Allocation(hashes, hit_idx, new_idx, touched, session)
        if hit_idx:
            self._reused.update(hit_hashes)
            if self.hit_mode == "holes" and touched[-1] != len(touched) - 1:
                alloc.holes, alloc.hole_lengths = _holes(hit_idx)
        return alloc

    def release(self, alloc: Allocation, now: float = 0.0) -> None:
        """Unpin a request's blocks; the policy hears of those no other request still holds."""
        if alloc.private:  # prefix caching off: its blocks were private, none pinned or cached
            self.private -= alloc.private
            return
        refs = self._refs
        hashes = alloc.hashes
        n = len(hashes)
        self._pins -= n
        if not self._pins:
            refs.clear()  # only this request held pins: the simulator's serial path
            freed: Sequence[int] = hashes
        else:
            counts = list(map(refs.__getitem__, hashes))
            if max(counts, default=0) == 1:  # no other request holds any of them (the usual case)
                freed = hashes
                deque(map(refs.__delitem__, hashes), maxlen=0)
            else:  # one pass each in C: decrement, pick the blocks left at zero, drop them
                left = list(map(sub, counts, repeat(1)))
                refs.update(zip(hashes, left))
                freed = list(compress(hashes, map(not_, left)))
                deque(map(refs.__delitem__, freed), maxlen=0)
        if freed:
            self.policy.on_release(freed, now)
        if self.policy.observes_pool:
            self.policy.on_pool_op(PoolOp(RELEASE, hashes, now, self.private))

    def store(self, hashes: Sequence[int], session: str | None = None, now: float = 0.0) -> list[int]:
        """Cache blocks a request produced beyond its prompt (its response's KV, vLLM colocated).

        Not a lookup: no hit metrics. Blocks already resident are left as they are; the others are
        inserted (evicting through the policy) while evictable room lasts, shallowest first, and
        released at once. Returns the hashes inserted (none with prefix caching off).
        """
        if not self.prefix_caching:
            return []
        res = self.resident
        new = [h for h in dict.fromkeys(hashes) if h not in res]
        new = new[:max(self.room, 0)]  # pinned and private blocks stay; everything else may go
        if new:
            shortfall = len(new) - self.free
            if shortfall > 0:
                self._evict(shortfall)
            self._insert(new, session)
            self.policy.on_access(Access(new, [], list(range(len(new))), now, session, None))
            self.release(Allocation(new, [], list(range(len(new))), [], session), now)
        if self.policy.observes_pool:  # every block it was given: a shadow applies this rule to its own residency
            self.policy.on_pool_op(PoolOp(STORE, hashes, now, self.private, session))
        return new

    def fill(self, hashes: Sequence[int], session: str | None = None, now: float = 0.0) -> Allocation | None:
        """Blocks a running request's decoding just filled become hashed blocks, findable at once (vLLM
        caches every full block in the step that computes its last token). Each was one of the pool's
        private blocks, held by that request: ``fill_picks`` says which it now pins instead (a lookup of
        them, not recorded, with one private block given back for each: no eviction); one another running
        request pins stays private (vLLM keeps both copies). Returns the allocation of the blocks it
        pinned, for the request to release with its own (None: none, or prefix caching off)."""
        if not self.prefix_caching:
            return None
        take = fill_picks(hashes, self.pins_of(hashes))
        if not take:
            return None
        self.free_private(len(take))
        return self._allocate(Lookup(take, session, now, record=False), hold=True, kind=FILL)

    def serve(self, lookup: Lookup) -> Allocation:
        """Acquire and release at once: a request served alone (the simulator's cache-only path).

        With nothing pinned and a policy that neither follows nor reads pins, the blocks are never
        pinned: the same allocation, without two passes over the request's hashes. ``lookup.extra``
        must be 0 (nothing is held after it).
        """
        policy = self.policy
        if self._refs or self.private or policy.takes_pins or policy.reads_pins or not self.prefix_caching:
            alloc = self.acquire(lookup)
            self.release(alloc, lookup.now)
            return alloc
        alloc = self._allocate(lookup, hold=False)
        policy.on_release(lookup.hashes, lookup.now)
        return alloc

    def admit(self, hashes: Sequence[int], now: float = 0.0) -> None:
        """Blocks written in from the level above (a tier's demotions): ``serve`` of them as one request
        of no session, the allocation not kept (so the compiled twin hands nothing back)."""
        self.serve(Lookup(hashes, now=now))

    def admit_absent(self, hashes: Sequence[int], now: float = 0.0) -> list[int]:
        """A tier level's write from above: of ``hashes``, those not resident (``absent``, returned: what
        the write newly stores), the first as many as the pool has room for (its capacity less what is
        pinned) ``admit``-ted; the rest, beyond that room, are the caller's to pass on."""
        new = self.absent(hashes)
        room = self.capacity - self.pinned
        if new and room > 0:
            self.admit(new[:room], now)
        return new

    def load_state(self, resident: Iterable[tuple[int, str | None]], footprint: Iterable[tuple[str | None, int]],
                   reused: Iterable[int], refs: Mapping[int, int], private: int) -> None:
        """Become what the compiled pool reached (``replica.core.compiled.pool``): the blocks, oldest
        inserted first, with their owners; footprints in the order a session last entered; the
        blocks reused since inserted; pins; unhashed blocks held."""
        self.resident.clear()
        self.resident.update(resident)
        self.footprint.clear()
        self.footprint.update(footprint)
        self._reused.clear()
        self._reused.update(reused)
        self._refs.clear()
        self._refs.update(refs)
        self._pins = sum(refs.values())
        self.private = private

    # ---- administration -----------------------------------------------------------
    def reset(self) -> int:
        """Drop every unpinned block (vLLM's reset_prefix_cache); returns how many."""
        dropped = [h for h in self.resident if h not in self._refs]
        for h in dropped:
            self.policy.on_remove(h)
        self._forget(dropped)
        if not self._refs:
            self.policy.clear()
        if self.emit_events:
            self.events.append(KvEvent("cleared", ()))
            if self.resident:
                self.events.append(KvEvent("stored", tuple(self.resident)))
        return len(dropped)

    def remove(self, hashes: Sequence[int], computed: bool = True) -> None:
        """Drop unpinned resident blocks (a block promoted out of a lower tier); others are ignored.
        ``computed=False``: blocks whose KV was never computed (an aborted request's unfinished
        prefill), which count as no eviction, one-hit or otherwise."""
        gone = [h for h in hashes if h in self.resident and h not in self._refs]
        for h in gone:
            self.policy.on_remove(h)
        self._forget(gone, evicted=computed)
        if self.emit_events and gone:
            self.events.append(KvEvent("removed", tuple(gone)))

    def set_policy(self, policy: EvictionPolicy, now: float = 0.0) -> None:
        """Switch policy live, keeping resident blocks; the oldest resident block becomes the first victim.

        The new policy sees the resident set as one request listed newest first: policies treat a
        request's last block as the first to go, so age order carries over.
        """
        hand_over(policy, self.policy_context, list(reversed(self.resident)), now)
        self.policy = policy

    def top_sessions(self, k: int = 10) -> list[tuple[str | None, int]]:
        return heapq.nlargest(k, self.footprint.items(), key=lambda kv: kv[1])

    def stats(self, top_k: int = 10) -> dict:
        out = {
            "policy": self.policy.describe(),
            "capacity_blocks": self.capacity,
            "block_size": self.block_size,
            "hit_mode": self.hit_mode,
            "prefix_caching": "on" if self.prefix_caching else "off",  # as --prefix-caching says it
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
    def _check_evictable(self, touched_hashes, shortfall: int) -> None:
        # Blocks this request reuses will be pinned, so they cannot be victims either.
        refs = self._refs
        newly_pinned = len(touched_hashes) - (sum(map(refs.__contains__, touched_hashes)) if refs else 0)
        if self.evictable - newly_pinned < shortfall:
            raise PoolBusyError(
                f"need {shortfall} more free blocks, only {self.evictable - newly_pinned} evictable"
            )

    def _pin(self, hashes) -> None:
        refs = self._refs
        if self.policy.takes_pins and hashes:
            # before any eviction: such a policy drops them from its order (vLLM's free queue)
            self.policy.on_pin([h for h in hashes if h not in refs] if refs else hashes)
        self._pins += len(hashes)
        if not refs:
            refs.update(dict.fromkeys(hashes, 1))
            return
        _count_elements(refs, hashes)  # C-level refs[h] += 1 for each h (what Counter.update uses)

    def _insert(self, new_hashes: list[int], session, pin: bool = True) -> None:
        if not new_hashes:
            return
        if pin:  # new blocks cannot already be pinned, so their reference counts start at 1
            self._refs.update(dict.fromkeys(new_hashes, 1))
            self._pins += len(new_hashes)
        self.resident.update(dict.fromkeys(new_hashes, session))
        fp = self.footprint
        fp[session] = fp.get(session, 0) + len(new_hashes)
        if self.emit_events:
            self.events.append(KvEvent("stored", tuple(new_hashes)))
        self.metrics.inserted += len(new_hashes)

    def _evict(self, count: int, pinned: Callable[[int], bool] | None = None) -> None:
        """Take ``count`` victims from the policy's order: the one place pinned blocks are skipped.

        A policy hands out blocks from its order without looking at pins. A pinned one (in use by
        a running request) is not evicted: it leaves the order here and comes back through
        ``on_release`` when its last request ends, as in vLLM's free queue. Each call removes at
        least one entry from the order and the pool holds ``count`` unpinned blocks (checked before),
        so the loop ends. ``pinned`` says which blocks to skip: by default those with a reference count;
        ``serve`` passes the request's own blocks instead of pinning them.
        """
        policy, refs = self.policy, self._refs
        victims = policy.victims(count)
        if pinned is None and refs:
            pinned = refs.__contains__
        if pinned is not None:
            victims = list(filterfalse(pinned, victims))
            while len(victims) < count:
                more = policy.victims(count - len(victims))
                if not more:
                    raise RuntimeError(f"{policy.name}: no victims left for {count - len(victims)} evictable blocks")
                victims += filterfalse(pinned, more)
        self._forget(victims)
        self.metrics.evictions += len(victims)
        if self.emit_events and victims:
            self.events.append(KvEvent("removed", tuple(victims)))
        if self.evicted_sink is not None and victims:
            self.evicted_sink(victims)

    def _forget(self, hashes: Sequence[int], evicted: bool = True) -> None:
        """Drop resident blocks: owners' footprints shrink; never-reused ones count as one-hit
        (``evicted``)."""
        fp = self.footprint
        owners: dict[str | None, int] = {}
        _count_elements(owners, map(self.resident.pop, hashes))  # C-level: owner -> blocks dropped
        for owner, c in owners.items():
            left = fp[owner] - c
            if left:
                fp[owner] = left
            else:
                del fp[owner]
        reused = self._reused
        before = len(reused)
        reused.difference_update(hashes)
        if evicted:
            self.metrics.one_hit_evictions += len(hashes) - (before - len(reused))


def fill_picks(hashes: Sequence[int], pins: Sequence[int]) -> list[int]:
    """Of the blocks a request just filled (``hashes``, with how many running requests pin each), those
    it pins in place of its private blocks: each not yet resident, or cached and unpinned (the same room
    either way), once. One another running request pins stays a private block: vLLM holds a second copy
    of it, so the room it takes is the same as there. The one rule, for the pool and its compiled twin."""
    return [h for h, p in dict.fromkeys(zip(hashes, pins)) if not p]


def _leading_run(idx: list[int]) -> list[int]:
    n = 0
    for i in idx:
        if i != n:
            break
        n += 1
    return idx[:n]


def _holes(hit_idx: list[int]) -> tuple[int, list[int]]:
    """Gaps of recomputed blocks that lie before a reused block."""
    lengths = []
    prev = -1
    for i in hit_idx:
        if i > prev + 1:
            lengths.append(i - prev - 1)
        prev = i
    return len(lengths), lengths
