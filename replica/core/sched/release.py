"""How a request leaves the scheduler, a part of ``Scheduler`` (its state is the scheduler's), kept apart so
each file holds one responsibility: its blocks go back as vLLM frees them, whichever way it leaves.

* It finishes (``_release``): where response KV is kept (a colocated vLLM), its full response blocks stay
  cached before its prompt is released; a prefill instance's request (``hold``) keeps its blocks pinned
  until its KV has crossed to the decode instance (``release_held``).
* It is preempted (``_preempt``, vLLM's recompute preemption): its blocks go back, it keeps the tokens it
  generated and waits again in arrival order; the full blocks it generated stay cached (``kept``).
* Its client went away (``abort``, vLLM's abort): it leaves wherever it is and never finishes; what it
  computed stays cached, evictable; the prompt blocks its prefill had not finished leave the pool.

The blocks decoding fills on the way (``_fill_due``) are pinned in place of the request's private blocks
until it leaves (``_pin_filled``, ``_unpin``); a copy another running request pins stays private until that
one lets go (``_adopt``).
"""

from __future__ import annotations

import heapq
from collections import _count_elements, deque  # type: ignore[attr-defined]  # C helper Counter uses
from collections.abc import Callable, Sequence

from mypy_extensions import mypyc_attr

from replica.core.cache.grouped import GroupedAllocation
from replica.core.cache.pool import Allocation, PoolBusyError
from replica.core.cache.types import ResponseStore, SchedulerPool
from replica.core.sched.reorder import ReorderLoans
from replica.core.sched.sched_types import SchedRequest, StepResult, StepTimer, prefill_len


@mypyc_attr(allow_interpreted_subclasses=True)  # its subclass Scheduler allows them
class Release(ReorderLoans):
    """A base of ``Scheduler``, on its admission and its loans; it owns the preemption count and the
    decoders' private copies of filled blocks (``_init_release``), and uses the scheduler's queues."""

    # the scheduler's attributes these use (set in Scheduler.__init__)
    keep_response_kv: bool
    timer: StepTimer | None
    _store: ResponseStore | None  # the pool as a store of response KV, None where it cannot keep any
    _tick: int
    _done_at: list[tuple[int, int, SchedRequest]]
    _decoders: dict[int, SchedRequest]
    _dec_input: int
    _dec_base: int
    _draft_tokens: int
    _now: float
    # its own (``_init_release``)
    preemptions: int
    on_preempt: Callable[[SchedRequest, float], None] | None
    _drops_uncomputed: bool
    _dups: dict[int, SchedRequest]

    def _init_release(self, pool: SchedulerPool) -> None:
        self.preemptions = 0
        # Called after a request is preempted (its blocks released): a host tier can keep its KV.
        self.on_preempt = None
        # a preemption mid-prefill drops the blocks it never computed (_preempt) where the pool can remove
        # them (the oracle policies' compiled twin cannot: the Python pool keeps them too, so both agree)
        policy = getattr(getattr(pool, "pool", pool), "policy", None)
        self._drops_uncomputed = hasattr(pool, "remove") and getattr(policy, "drops_uncomputed", True)
        self._dups = {}  # id -> decoders holding private copies of filled blocks

    def _extend_running(self) -> bool:
        """Before admissions, the requests already prefilling take their groups' blocks for this step's chunks
        (vLLM schedules the running requests first: their chunks' blocks are allocated, and cached, before a
        waiting request looks up its hit or is counted against the free blocks). A chunk finding no block
        preempts the latest admitted running request until it fits or is itself the one preempted (vLLM's
        running loop; admissions made on the free blocks alone can need more than the pool holds).
        Whether anything was preempted."""
        left = self.settings.token_budget - len(self._done_at) - self._draft_tokens
        preempted = False
        for r in list(self.prefilling):
            if left <= 0:
                break
            if r.alloc is None:  # preempted for an earlier one's chunk
                continue
            seg = r.segments[0]
            take = self._chunk(r, seg[0], min(seg[1], left))
            while not self._extend(r, seg[0] + take, self._now):
                victim = max([*self.prefilling, *(e[2] for e in self._done_at)], key=lambda x: x.admit_seq)
                self._preempt(victim, self._now)
                preempted = True
                if victim is r:
                    break
            else:
                left -= take
        return preempted

    def _extend(self, r: SchedRequest, end: int, now: float) -> bool:
        """Groups take the blocks of a prefill chunk ending at ``end`` (vLLM allocates a chunk's slots as it
        schedules it); False when none is left."""
        groups, alloc = self._groups, r.alloc
        assert groups is not None
        if not isinstance(alloc, GroupedAllocation):
            return True
        try:
            groups.extend(alloc, end, len(alloc.hashes) + r.extra_blocks, now)
        except PoolBusyError:
            return False
        return True

    def _fill_due(self, tick: int, now: float) -> None:
        """The blocks decoders fill in the steps up to ``tick`` are hashed and findable at once: vLLM
        caches every full block in the step that schedules its last token, before that step admits
        anyone, so a turn arriving while the one before it still decodes hits what it generated so far.
        The pool pins them in place of the request's private blocks (``BlockPool.fill``; KV events as they
        fill). With inclusive tiers each is copied to the first level below as it fills (FlashGen), so a
        preemption or HBM eviction loses nothing."""
        store = self._store
        if store is None:
            return
        for r, hashes in self.decode_kv.filled(tick):
            want = [*r.dups, *hashes] if r.dups else hashes  # shallowest first: the pool's release order
            self._pin_filled(r, store.fill(want, r.session, now), want)
            if self.tiers is not None:
                self.tiers.produced(hashes, now)

    def _pin_filled(self, r: SchedRequest, alloc: Allocation | None, hashes: list[int]) -> None:
        """``r`` pins the filled blocks of ``alloc`` in place of as many private blocks; those of ``hashes``
        it does not pin (another running request pins them) it holds as private copies (``dups``, which
        ``hashes`` includes)."""
        taken: Sequence[int] = ()
        if alloc is not None:
            taken = alloc.hashes
            n = len(taken)
            r.fills.append(alloc)
            r.fill_pins += n
            r.extra_blocks -= n
            if r.order in self._promoted:  # lent memory (reorder): these go back with it
                _count_elements(self._lent, taken)
        if len(taken) < len(hashes):
            r.dups = [h for h in hashes if h not in taken] if taken else list(hashes)
            self._dups[id(r)] = r
        elif r.dups:
            r.dups = []
            del self._dups[id(r)]

    def _adopt(self, now: float) -> None:
        """Blocks were released: a decoder holding a private copy of a filled block whose other holder let
        go pins the hashed block instead (vLLM keeps its own copy cached, so the hash stays findable as
        long as either copy is, and the room either takes is the same)."""
        store = self._store
        assert store is not None
        for r in list(self._dups.values()):
            dups = r.dups
            self._pin_filled(r, store.fill(dups, r.session, now), dups)

    def _unpin(self, r: SchedRequest, now: float) -> list[int]:
        """Release ``r``'s hashed blocks: those it pinned as decoding filled them (the deepest first, as
        vLLM frees a request's blocks tail first), then its allocation's. Returns the filled ones."""
        assert r.alloc is not None
        filled: list[int] = []
        release_request = getattr(self.pool, "release_request", None)  # KV cache groups: group by group
        if release_request is not None:
            release_request(r.alloc, r.fills, now)
        else:
            for alloc in reversed(r.fills):
                self.pool.release(alloc, now)
        for alloc in r.fills:
            filled.extend(alloc.hashes)
        r.fills = []
        r.fill_pins = 0
        if r.dups:  # its private copies went back with its private blocks (``DecodeBlocks.forget``)
            r.dups = []
            del self._dups[id(r)]
        if release_request is None:
            self.pool.release(r.alloc, now)
        if self._dups:
            self._adopt(now)
        return filled

    def _preempt(self, r: SchedRequest, now: float) -> None:
        """Recompute preemption (vLLM): release the request's blocks, keep the tokens it
        generated, and queue it again in arrival order; re-admission prefills its prompt (what
        is still cached is a hit) and its generated tokens, then decoding goes on.

        Where response KV is kept, the full blocks it generated stay cached as vLLM v1 keeps every
        full block (``kept``: its re-admission looks them up, in HBM and, with inclusive tiers, in
        the host copies made as they filled, restoring rather than recomputing what is found).
        Preempted while prefilling, the prompt blocks it inserted whose KV it had not computed leave
        the pool, as an abort's (vLLM caches a block only once it schedules the block's tokens)."""
        uncomputed = self._uncomputed(r) if self._drops_uncomputed else []
        self._free_blocks(r, now, self._leave_running(r))
        if uncomputed:
            self.pool.remove(uncomputed, computed=False)
        r.preemptions += 1
        self.preemptions += 1
        r.t_queued = now
        self.queued_prefill_tokens += prefill_len(r)
        waiting = self.waiting
        i = 0
        while i < len(waiting) and waiting[i].order < r.order:
            i += 1
        waiting.insert(i, r)
        self._dirty = True
        if self.on_preempt is not None:
            self.on_preempt(r, now)

    def abort(self, r: SchedRequest, now: float) -> bool:
        """The client went away (vLLM aborts the request): ``r`` leaves the scheduler wherever it is
        and never finishes (nothing in a step's ``finished``). False: it is not here (finished, or
        never submitted).

        Waiting, new or preempted (a preemption released its blocks already): it leaves the queue.
        Admitted: its blocks go back as vLLM frees an aborted request's. The full blocks whose KV was
        computed stay cached, evictable: its prompt's hits, the prompt blocks its prefill finished,
        and, where response KV is kept, the full blocks it generated (vLLM v1 caches every full block
        as it is computed; a preemption keeps the same ones). The prompt blocks it inserted that its
        prefill had not finished leave the pool (vLLM never cached them), unless another running
        request holds them; its unhashed blocks (a partial tail, decode KV) are freed. The rest of its
        response is never stored, as a finish's would be."""
        if r.alloc is None:  # waiting
            waiting = self.waiting
            for i, x in enumerate(waiting):
                if x is r:
                    del waiting[i]
                    self.queued_prefill_tokens -= prefill_len(r)
                    self._dirty = True
                    return True
            return False
        if not r.segments and id(r) not in self._decoders:
            return False  # finished
        alloc = r.alloc
        uncomputed = self._uncomputed(r)
        stored = self._free_blocks(r, now, self._leave_running(r))
        remove = getattr(self.pool, "remove", None)  # the Python pool (a live replica's)
        if uncomputed and remove is not None:
            remove(uncomputed, computed=False)
        if self.tiers is not None:
            self.tiers.released(alloc.hashes, stored, now)
        self._dirty = True
        return True

    def _uncomputed(self, r: SchedRequest) -> list[int]:
        """Hashes of the blocks ``r``'s allocation inserted that its prefill has not finished (some of
        their tokens are in a segment still to compute). Hits, restored blocks and blocks other
        requests had made resident are none of them."""
        alloc = r.alloc
        if alloc is None or alloc.private or not r.segments:  # prefix caching off: nothing was inserted
            return []
        bs = self.pool.block_size
        spans = [(s[0], s[0] + s[1]) for s in r.segments if s[1] > 0]
        return [alloc.hashes[i] for i in alloc.new_idx
                if any(lo < (i + 1) * bs and hi > i * bs for lo, hi in spans)]

    def _leave_running(self, r: SchedRequest) -> bool:
        """Take an admitted request out of the prefill queue or the decoders (its blocks still held);
        returns whether it was prefilling."""
        prefilling = bool(r.segments)
        if prefilling:
            self.prefilling = deque(x for x in self.prefilling if x is not r)
            self.queued_prefill_tokens -= sum(s[1] for s in r.segments)
            r.segments = []
        else:
            self._done_at = [e for e in self._done_at if e[2] is not r]
            heapq.heapify(self._done_at)
            del self._decoders[id(r)]
            self._dec_input -= r.input_tokens
            self._dec_base -= r.base
            r.generated = self._tick - r.base
        self._unlend(r)
        return prefilling

    def _free_blocks(self, r: SchedRequest, now: float, prefilling: bool) -> list[int]:
        """Release a request's blocks once it left running (``_leave_running``); where response KV is
        kept, the full blocks it generated stay cached (returned: those decoding filled, hashed as they
        filled, and those it stored now, which another request held or which were evicted since).
        Preemption and abort alike."""
        assert r.alloc is not None
        # decoding: the full blocks of its computed KV (prompt and every generated token but the last)
        # beyond the prompt's; prefilling: none new
        full = (r.input_tokens + r.generated - 1) // self.pool.block_size - len(r.hashes)
        filled = r.kept if prefilling else min(max(full, r.kept), len(r.response_hashes))
        self.decode_kv.forget(r)
        stored: list[int] = []
        pinned = [h for alloc in r.fills for h in alloc.hashes]
        if filled and self.keep_response_kv and self._store is not None:
            # cached before the prompt is released, as a finish's (``_release``): vLLM frees a request's
            # blocks tail first, so its generated blocks are evicted before the prompt they extend
            stored = self._store.store(r.response_hashes[r.kept:filled], r.session, now)
            if (stored or pinned) and self.timer is not None:  # a backend with real K/V computes theirs
                self.timer.stored(r, [*pinned, *stored])
            if self.tiers is not None:
                self.tiers.produced(stored, now)
            r.kept = filled
        self._unpin(r, now)
        r.alloc = None
        r.full = r.kept
        return [*pinned, *stored]

    def _release(self, r: SchedRequest, result: StepResult, end: float) -> None:
        r.t_finished = end
        assert r.alloc is not None  # admitted requests hold an allocation
        if self._promoted:
            self._unlend(r)
        self.decode_kv.forget(r)
        stored: list[int] = []
        pinned = [h for alloc in r.fills for h in alloc.hashes]
        if self.keep_response_kv and r.response_hashes:  # colocated vLLM: the response's KV stays cached
            pool = self._store
            if pool is None:  # a pool that cannot keep response KV
                raise TypeError(f"{type(self.pool).__name__} cannot keep response KV")
            # What decoding filled is cached already (``_fill_due``); the rest (blocks another request
            # held as it filled them, or a last block the client's hashes cover) is stored now, before
            # the prompt is released: vLLM frees a finished sequence's blocks tail first (generated,
            # then prompt): the response's blocks leave before the prompt they extend, so a block never
            # leaves before the blocks chained after it (SGLang's radix tree evicts leaves only: the same order).
            stored = pool.store(r.response_hashes, r.session, end)
            if (stored or pinned) and self.timer is not None:
                self.timer.stored(r, [*pinned, *stored])
        result.finished.append(r)
        if r.hold:  # a prefill instance's: pinned until its KV has crossed to the decode instance
            return
        self._unpin(r, end)
        if self.tiers is not None:
            self.tiers.produced(stored, end)
            self.tiers.released(r.alloc.hashes, [*pinned, *stored], end)
        self._dirty = True

    def release_held(self, r: SchedRequest, now: float) -> None:
        """The KV transfer of a finished prefill request (``hold``) ended: its blocks go back, cached."""
        if r.alloc is None:
            return
        r.hold = False
        filled = self._unpin(r, now)
        if self.tiers is not None:
            self.tiers.released(r.alloc.hashes, filled, now)
        r.alloc = None
        self._dirty = True
