"""How a request enters the scheduler, a part of ``Scheduler`` (its state is the scheduler's), kept apart
so each file holds one responsibility: the one admission bookkeeping every way in shares.

Two ways in, as vLLM's scheduler has them:

* ``submit``: a request joins the waiting queue; an admission (``_acquire`` then ``_start``) later
  takes its blocks and puts it in the prefill queue.
* Disaggregated prefill (replica/core/disagg.py), a decode instance's side, vLLM's
  ``WAITING_FOR_REMOTE_KVS``: ``reserve_remote`` takes the blocks of a request whose prompt was
  computed elsewhere when its transfer starts, as vLLM's scheduler allocates a remote-prefill request's
  blocks before the connector loads into them; the blocks the instance already holds are hits (pinned,
  not transferred: ``reserved_hits``), the rest are inserted for the KV that arrives. It fails (False)
  when the pool cannot hold them now: the caller falls back to a local prefill. The lookup is not
  counted in the pool's hit metrics: the instance computes nothing for it (what it held is reported as
  the transfer it saved). ``remote_arrived`` admits it once its KV is in: it computes the prompt's last
  token again (vLLM's decode instance does: that forward yields the first token), then decodes like any
  request. ``cancel_remote`` gives the blocks back if the transfer never ends (the prefill instance went
  away, the client left): the blocks whose KV never came leave the pool.

  A reserved request is in no queue of the scheduler (vLLM keeps it out of the schedulable ones), so no
  preemption picks it and no step waits on it; the pool's pins count it in its usage. Lower memory tiers
  are not consulted for a reservation: what the decode instance lacks in HBM crosses the network.

Both ways share the rule of what a request can never run here (``refusal``), its place in arrival order
(``_number``), the allocation of its blocks (``_allocate``) and what an admission counts (``_admitted_now``,
``_join_prefill``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mypy_extensions import mypyc_attr

from replica.core.cache.groups import state_chunk_tokens
from replica.core.cache.pool import PoolBusyError, PoolCapacityError
from replica.core.cache.types import Lookup
from replica.core.sched.decode_kv import DecodeBlocks
from replica.core.sched.sched_types import ContextLengthError, QueueFullError, SchedRequest, prefill_len, prefill_segments
from replica.core.sched.v0_steps import StepBudget
from replica.core.sched.v0_steps import refusal as v0_refusal
from replica.core.tiers.stack import TierStack
from shared.errors import InputError


@mypyc_attr(allow_interpreted_subclasses=True)  # its subclass Scheduler allows them
class Admission:
    """The base of ``Scheduler`` (through ``ReorderLoans``); it owns the admission counters
    (``_init_admission``) and uses the scheduler's queues, pool and settings."""

    # the scheduler's attributes these use (set in Scheduler.__init__)
    waiting: Any
    prefilling: Any
    settings: Any
    pool: Any
    tiers: TierStack | None
    decode_kv: DecodeBlocks
    queued_prefill_tokens: int
    _dirty: bool
    _v0: StepBudget | None  # while a v0 step admits, else None
    _groups: Any  # the GroupedPool of a model of several KV cache groups, else None
    # its own (``_init_admission``)
    _order: int
    _admitted: int
    refused: int
    admissions: int
    queue_wait_s: float
    prefill_tokens: int
    readmission_prefill_tokens: int

    def _init_admission(self) -> None:
        self._order = 0  # requests numbered in arrival order: each request's order
        self._admitted = 0  # admissions so far: each request's admit_seq
        self.refused = 0  # requests that could never run here (``refusal``)
        self.admissions = 0
        self.queue_wait_s = 0.0  # seconds waited, summed over admissions
        self.prefill_tokens = 0  # tokens admissions had to prefill (cache misses, holes, tails)
        self.readmission_prefill_tokens = 0  # ... of them, by re-admissions after a preemption

    # ---- the ways in ----------------------------------------------------------------
    def refusal(self, req: SchedRequest) -> InputError | None:
        """Why ``req`` can never run here, or None: vLLM's length rule (prompt plus max_tokens over
        ``max_model_len``), then a prompt or output the whole pool could never hold (a trace whose
        hashes say more than its token counts). Every such request is refused, never cut short: vLLM
        stops a sequence at max_model_len only when max_tokens was left to it, and a trace's
        output and a client's max_tokens are always given here."""
        limit = self.settings.max_model_len
        if limit and req.input_tokens + req.output_tokens > limit:
            return ContextLengthError(limit, req.input_tokens, req.output_tokens)
        capacity = self.pool.capacity
        # KV cache groups: what admission counts on an empty pool (GroupedPool.admission_need: a window at its cap,
        # vLLM's full_sequence_must_fit), for the prompt and for a re-admission after a preemption at its longest,
        # so a request is either refused here or admitted once the pool is idle, never left waiting
        need = getattr(self.pool, "admission_need", None)
        prompt = len(req.hashes) if need is None else need(len(req.hashes) + self.decode_kv.need(req, 0))
        if prompt > capacity:
            return PoolCapacityError(prompt, capacity)
        most = self.decode_kv.most(req)
        if need is not None:
            most = need(most)
        if most > capacity:
            return PoolCapacityError(most, capacity, "max_tokens")
        if self.settings.step_rule == "v0":
            return v0_refusal(req, self.settings.token_budget)
        return None

    def submit(self, req: SchedRequest) -> None:
        """Queue a request; one that can never run here (``refusal``) is refused (counted in ``refused``)."""
        if len(self.waiting) >= self.settings.max_waiting:
            raise QueueFullError(self.settings.max_waiting)
        self._check_refusal(req)
        self._number(req, req.arrival)
        self.waiting.append(req)
        self.queued_prefill_tokens += req.input_tokens
        if self.tiers is not None:  # a lower level's reads are staged while it waits (FlashGen)
            self.tiers.stage(req.hashes, req.arrival)
        if len(self.waiting) <= self.settings.reorder_window + 1:  # within reach of _promote
            self._dirty = True

    def reserve_remote(self, req: SchedRequest, now: float) -> bool:
        """Take ``req``'s blocks for the KV about to arrive (``WAITING_FOR_REMOTE_KVS``); False when the
        pool cannot hold them now. A request that could never run here raises, as ``submit`` does."""
        self._check_refusal(req)
        try:
            self._allocate(req, req.hashes, self._extra_at_admission(req), now, False)
        except PoolBusyError:
            return False
        self._number(req, now)
        return True

    def reserved_hits(self, req: SchedRequest) -> int:
        """Blocks of the prompt the decode instance already held when it reserved (not transferred)."""
        return len(req.alloc.hit_idx) if req.alloc is not None else 0

    def remote_arrived(self, req: SchedRequest, now: float) -> None:
        """The KV of a reserved request is in: it joins the prefill queue with its prompt's last token
        to compute (what came over the network counts as cached: computed, not by this instance)."""
        assert req.alloc is not None, "remote_arrived() after reserve_remote()"
        self._admitted_now(req, now)
        req.segments = [[req.input_tokens - 1, 1]]
        req.cached_tokens = req.input_tokens - 1
        self.queued_prefill_tokens += 1
        self._join_prefill(req, 1)

    def cancel_remote(self, req: SchedRequest, now: float) -> None:
        """The KV of a reserved request will never arrive: its blocks go back, and those inserted for it
        leave the pool."""
        alloc = req.alloc
        if alloc is None:
            return
        self.decode_kv.forget(req)  # its private blocks (a partial prompt tail) go back with it
        self.pool.release(alloc, now)
        req.alloc = None
        remove = getattr(self.pool, "remove", None)
        lost = [alloc.hashes[i] for i in alloc.new_idx]
        if lost and remove is not None and not alloc.private:
            remove(lost, computed=False)
        self._dirty = True

    # ---- the bookkeeping both share ---------------------------------------------------
    def _check_refusal(self, req: SchedRequest) -> None:
        if (why := self.refusal(req)) is not None:
            self.refused += 1
            raise why

    def _number(self, req: SchedRequest, now: float) -> None:
        """``req`` entered at ``now``: its place in arrival order."""
        self._order += 1
        req.order = self._order
        req.t_queued = now

    def _allocate(self, req: SchedRequest, hashes: Sequence[int], extra: int, now: float, record: bool) -> None:
        """The pool's allocation of ``hashes`` and ``extra`` private blocks for ``req`` (``record``: counted in
        the pool's hit metrics), or ``PoolBusyError``."""
        # a request resumed after a preemption recomputes its output too: its tokens bound the hit (vLLM's
        # num_tokens - 1, what KV cache groups cap a hit at)
        tokens = req.input_tokens + req.generated if req.resumed else req.input_tokens
        req.alloc = self.pool.acquire(Lookup(hashes, req.session, now, tokens, record, extra,
                                             req.next_use, req.position))
        req.extra_blocks = extra

    def _admitted_now(self, req: SchedRequest, now: float) -> None:
        self._admitted += 1
        req.admit_seq = self._admitted
        req.t_admitted = now
        self.admissions += 1

    def _join_prefill(self, req: SchedRequest, todo: int) -> None:
        """An admitted request, ``todo`` tokens to compute, joins the prefill queue."""
        self.prefill_tokens += todo
        if req.preemptions:
            self.readmission_prefill_tokens += todo
        self.prefilling.append(req)
        self._dirty = True

    # ---- admission from the waiting queue -------------------------------------------
    def _acquire(self, req: SchedRequest, now: float, reserve: int = 0) -> None:
        """Allocate ``req``'s blocks, leaving at least ``reserve`` blocks of room (and vLLM v0's
        watermark), or raise ``PoolBusyError``."""
        extra = self._extra_at_admission(req)
        hashes = self._kv_hashes(req)
        reserve = max(reserve, int(self.settings.watermark * self.pool.capacity))
        if reserve and self.pool.room - self._takes(hashes, extra) < reserve:
            raise PoolBusyError("the admission would leave less room than the reserve")
        tiers = self.tiers
        req.plan = tiers.plan(hashes, now) if tiers is not None else None
        try:
            self._allocate(req, hashes, extra, now, not req.preemptions)
        except PoolBusyError:
            if req.plan is not None and tiers is not None:
                tiers.cancel(req.plan)
                req.plan = None
            raise

    def _start(self, req: SchedRequest, now: float) -> None:
        """An admitted request (its blocks acquired) joins the prefill queue."""
        assert req.alloc is not None
        if self._v0 is not None:
            self._v0.took(req)
        self._admitted_now(req, now)
        wait = now - req.t_queued
        req.waited += wait
        self.queue_wait_s += wait
        reused = req.alloc.hit_idx
        plan, tiers = req.plan, self.tiers
        if plan is not None and tiers is not None:
            alloc = req.alloc
            tiers.complete(plan, alloc.hashes, alloc.hit_idx, alloc.new_idx, now, record=not req.preemptions)
            req.ready_at, req.restore_start = plan.ready_at, plan.started_at
            if plan.restored_idx:  # restored blocks count as reused: only the rest is computed
                reused = sorted(alloc.hit_idx + plan.restored_idx)
            # kept until its first chunk runs: the step asks its transfers' ends then (links are shared)
            req.plan = plan if plan.waits else None
        bs = self.pool.block_size
        req.segments = prefill_segments(req, reused, bs, req.generated if req.resumed else 0)
        # a prompt cached whole computes its last block again (prefill_segments): not cached, as vLLM counts it
        req.cached_tokens = min(len(reused) * bs, req.input_tokens, req.segments[-1][0])
        todo = sum(s[1] for s in req.segments)
        self.queued_prefill_tokens -= prefill_len(req) - todo
        self._join_prefill(req, todo)

    def _chunk(self, r: SchedRequest, start: int, take: int) -> int:
        """Tokens of ``r``'s prefill chunk from ``start`` where ``take`` fit the step: all of them, or with state groups
        cut where a state can be kept (groups.py ``state_chunk_tokens``, vLLM's ``_mamba_block_aligned_split``)."""
        groups = self._groups
        if groups is None or not groups.states.ids:
            return take
        alloc = r.alloc
        junction = alloc.state.junction if alloc is not None and hasattr(alloc, "state") else 0
        return state_chunk_tokens(start, take, r.input_tokens, prefill_len(r), groups.block_size,
                                  self.settings.token_budget, junction)

    def _demand(self, r: SchedRequest, left: int) -> int:
        """Tokens of the step's budget ``r``'s prefill takes (its segments; with state groups its cut chunk)."""
        if self._groups is None or not self._groups.states.ids:
            return sum(s[1] for s in r.segments)
        return self._chunk(r, r.segments[0][0], min(r.segments[0][1], left)) if r.segments and left > 0 else 0

    def _prefill_demand(self, left: int) -> int:
        """Tokens of ``left`` the requests already prefilling take in a step, in their order."""
        total = 0
        for r in self.prefilling:
            total += self._demand(r, left - total)
        return total

    def _kv_hashes(self, r: SchedRequest) -> Sequence[int]:
        """The hashed blocks ``r`` looks up when admitted: its prompt's, then the response blocks it
        generated before a preemption (``kept``)."""
        return [*r.hashes, *r.response_hashes[:r.kept]] if r.kept else r.hashes

    def _takes(self, hashes: Sequence[int], extra: int) -> int:
        """Blocks of room an allocation of ``hashes`` (and ``extra`` private ones) uses up: all but
        those running requests already pin (a cached unpinned block was evictable room)."""
        return len(hashes) - sum(map(bool, self.pool.pins_of(hashes))) + extra

    def _extra_at_admission(self, req: SchedRequest) -> int:
        return self.decode_kv.need(req, req.generated if req.resumed else 0)

    def _fits(self, req: SchedRequest) -> bool:
        pool = self.pool
        return pool.pinned + pool.private + self._takes(self._kv_hashes(req), self._extra_at_admission(req)) \
            <= pool.capacity
