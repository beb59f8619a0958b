"""``reorder`` admission (FlashGen, Jeong and Ahn, ASPLOS 2025): the loans of idle memory to requests
behind a blocked head, and taking them back. A part of ``Scheduler`` (its state is the scheduler's:
``_promoted``, ``_promoted_orders``, ``_lent``), kept apart so each file holds one responsibility."""

from __future__ import annotations

import heapq
from abc import abstractmethod
from collections import _count_elements  # type: ignore[attr-defined]  # C helper Counter uses

from mypy_extensions import mypyc_attr

from replica.core.cache.pool import PoolBusyError
from replica.core.sched.admission import Admission
from replica.core.sched.sched_types import SchedRequest


@mypyc_attr(allow_interpreted_subclasses=True)  # its subclass Scheduler allows them
class ReorderLoans(Admission):
    """A base of ``Scheduler``, on its admission (``Admission``); every attribute it uses is the scheduler's."""

    # the scheduler's attributes and methods these use (set in Scheduler.__init__ / defined there)
    promotions: int
    _promoted: dict[int, SchedRequest]
    _promoted_orders: list[int]
    _lent: dict[int, int]

    # Scheduler defines these; declared abstract on the mixin (not under TYPE_CHECKING) so that mypyc, which
    # compiles this class (shared/compiled_modules.py), sees them.
    @property
    @abstractmethod
    def num_running(self) -> int: ...

    @abstractmethod
    def _preempt(self, r: SchedRequest, now: float) -> None: ...

    def _promote(self, now: float) -> None:
        """The head does not fit: admit shorter requests behind it (up to ``reorder_window`` tried)
        into the memory it leaves idle. They are lent that memory and preempted once the head could run."""
        waiting, max_running, pool = self.waiting, self.settings.max_running, self.pool
        head_blocks = len(self._kv_hashes(waiting[0]))
        max_loans = self.settings.max_loans
        i, tried = 1, 0
        while i < len(waiting) and tried < self.settings.reorder_window and self.num_running < max_running:
            # Lend only what is idle beyond one block per running request (its next decode block),
            # the candidate's own included: a loan must not make the running requests preempt.
            reserve = self.num_running + 1
            if pool.room <= reserve:
                break  # no idle block left
            r = waiting[i]
            v0 = self._v0  # step_rule v0: a promoted prompt is whole, within the step's budget too
            if r.loans >= max_loans or len(self._kv_hashes(r)) >= head_blocks or (v0 is not None and not v0.takes(r)):
                i += 1
                continue
            tried += 1
            try:
                self._acquire(r, now, reserve)
            except PoolBusyError:
                i += 1
                continue
            del waiting[i]
            self._start(r, now)
            r.loans += 1
            self.promotions += 1
            self._promoted[r.order] = r
            heapq.heappush(self._promoted_orders, r.order)
            assert r.alloc is not None
            _count_elements(self._lent, r.alloc.hashes)
        self._dirty = False  # admissions here change nothing the head waits for

    def _unlend(self, r: SchedRequest) -> None:
        """``r`` is no longer preemptible (finished, preempted, or its turn came)."""
        if self._promoted.pop(r.order, None) is None:
            return
        lent = self._lent
        assert r.alloc is not None
        # its allocation's blocks, and those it pinned as decoding filled them while lent (``_fill_due``)
        for h in [*r.alloc.hashes, *(h for alloc in r.fills for h in alloc.hashes)]:
            left = lent[h] - 1
            if left:
                lent[h] = left
            else:
                del lent[h]

    def _catch_up(self) -> None:
        """After an admission in order: requests lent memory that arrived before the new head
        would have run before it under FCFS, so they keep their memory (no longer reclaimable)."""
        head = self.waiting[0].order if self.waiting else float("inf")
        orders = self._promoted_orders
        while orders and orders[0] < head:
            r = self._promoted.get(heapq.heappop(orders))
            if r is not None:
                self._unlend(r)

    def _reclaim_for(self, head: SchedRequest, now: float) -> bool:
        """Preempt lent requests, youngest first, if taking all of them back lets ``head`` run.

        Only requests admitted in arrival order (before ``head``) then hold memory the head cannot
        take: once they have finished it runs, whatever arrives behind it. The head's wait is thus
        bounded by the time its predecessors take (the bound the starvation test checks).
        """
        if not self._promoted:
            return False
        lent, pool = self._lent, self.pool
        # pinned by lent requests only, and the blocks they hold privately (beyond their hashed ones,
        # and with prefix caching off their hashed ones too: those are never pinned)
        reclaimable = sum(1 for c, p in zip(lent.values(), pool.pins_of(list(lent))) if p == c) + sum(
            r.extra_blocks + r.alloc.private for r in self._promoted.values() if r.alloc is not None)
        if not reclaimable:
            return False
        kept = pool.pinned + pool.private - reclaimable
        hashes = self._kv_hashes(head)
        overlap = sum(1 for h, p in zip(hashes, pool.pins_of(hashes)) if p > lent.get(h, 0))
        if kept + len(hashes) - overlap + self._extra_at_admission(head) > pool.capacity:
            return False
        for order in sorted(self._promoted, reverse=True):
            self._preempt(self._promoted[order], now)
            if self._fits(head):
                break
        return True

