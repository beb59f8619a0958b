"""The decoding requests' side of ``Scheduler``, a part of it (its state is the scheduler's), kept apart so the
scheduler's module reads as the step's outline: what decoders do in a step and what it costs.

* The decode heap (``_add_decoder``, ``_retire``): decoders share one decode counter (``_tick``), each kept by
  the tick at which it finishes, so a step costs O(changes + log running).
* The blocks they take before a step (``_grow_now``, ``decode_kv.DecodeBlocks``), oldest admission first, with
  vLLM's recompute preemption when none is left; a KV cache group's window frees what it passed just before its
  request's allocation (``_slide``, vLLM's ``remove_skipped_blocks``).
* A decode-only run (``_decode_run_length``, ``_decode_time``, ``_window_kv``): with nothing to prefill, a step
  fast-forwards several decode steps up to a horizon, priced at the run's midpoint.
* Speculative decoding's steps (``_plan_drafts``, ``_verify``, ``_draft_time``; the acceptance models are in
  spec_decode.py): each decoder's drafts, the verify forward's kept tokens, the drafter's time.
"""

from __future__ import annotations

import heapq
from abc import abstractmethod

from mypy_extensions import mypyc_attr

from replica.core.cache.grouped import GroupedAllocation
from replica.core.sched.release import Release
from replica.core.sched.sched_types import SchedRequest, StepResult
from replica.core.sched.spec_decode import Acceptance
from shared.costmodel import CostModel, StepWork
from shared.spec_cost import draft_seconds


@mypyc_attr(allow_interpreted_subclasses=True)  # its subclass Scheduler allows them
class Decoding(Release):
    """A base of ``Scheduler``, on its admission, loans and release; every attribute it uses is the scheduler's."""

    # the scheduler's attributes and methods these use (set in Scheduler.__init__ / defined there)
    cost: CostModel
    report_decoded: bool
    acceptance: Acceptance | None
    _window: int
    _seq: int
    _spec_k: int
    _drafts: list[tuple[SchedRequest, int]]
    _draft_kv: int
    _draft_window_kv: int
    spec_verifies: int
    spec_drafts: int
    spec_accepted: int

    # Scheduler defines it; declared abstract here (not under TYPE_CHECKING) so that mypyc, which compiles this
    # class (shared/compiled_modules.py), sees it.
    @property
    @abstractmethod
    def running(self) -> list[SchedRequest]: ...

    # ---- the decode heap: decoders join it after their prefill, leave it at their last token ------
    def _add_decoder(self, r: SchedRequest) -> None:
        r.base = self._tick - r.generated
        self._seq += 1
        heapq.heappush(self._done_at, (r.base + r.output_tokens, self._seq, r))
        self._decoders[id(r)] = r
        self._dec_input += r.input_tokens
        self._dec_base += r.base
        self.decode_kv.start(r)

    def _retire(self, result: StepResult, end: float) -> None:
        """Decoders whose last token came in this step finish at its end (in admission order)."""
        done_at, tick = self._done_at, self._tick
        while done_at and done_at[0][0] <= tick:
            r = heapq.heappop(done_at)[2]
            del self._decoders[id(r)]
            self._dec_input -= r.input_tokens
            self._dec_base -= r.base
            r.generated = r.output_tokens
            self._release(r, result, end)

    # ---- the blocks decoders take before a step (decode_kv.py), and the windows' slides -------
    def _grow_now(self, now: float) -> bool:
        """Each decoding request that needs a block in this step gets one, oldest admission first;
        when none is free or evictable the most recently admitted running request is preempted
        until it fits (or it was the one preempted). Returns whether anything was preempted."""
        decode_kv, preempted = self.decode_kv, False
        if self._groups is not None:  # a new step: the states the last one cached are computed (grouped.new_step)
            self._groups.new_step()
        # windows (vLLM's allocate_slots, request by request in its running order): each request frees what its
        # window passed just before its own allocation, so an earlier request's need does not see a later one's
        slide = sorted(self.running, key=_admit_seq) if self._groups is not None else []
        slid = 0
        while (r := decode_kv.due(self._tick)) is not None:
            while slid < len(slide) and slide[slid].admit_seq <= r.admit_seq:
                self._slide(slide[slid], now)
                slid += 1
            while not decode_kv.grant(r):
                victim = max(self.running, key=_admit_seq)
                self._preempt(victim, now)
                preempted = True
                if victim is r:
                    break
        for r in slide[slid:]:
            self._slide(r, now)
        return preempted

    def _slide(self, r: SchedRequest, now: float) -> None:
        """vLLM's ``remove_skipped_blocks`` before a request's allocation: its window groups free the blocks their
        windows passed at its computed tokens (a decoder's last sampled token is not computed)."""
        groups, alloc = self._groups, r.alloc
        assert groups is not None
        if not isinstance(alloc, GroupedAllocation):  # preempted by an earlier request's need
            return
        if r.segments:
            computed = r.segments[0][0]
        else:
            computed = r.input_tokens + self._tick - r.base - 1
        groups.slide(alloc, computed, now, r.fills, r.response_hashes, r.kept)

    # ---- a decode-only run: its price, and how far it may fast-forward -----------------------
    def _window_kv(self, decoders: int) -> int:
        """The KV tokens a window layer reads for the step's decoders: sum of min(context, window)."""
        if not decoders:
            return 0
        w, tick = self._window, self._tick
        total = 0
        for r in self._decoders.values():
            k = r.input_tokens + tick - r.base
            total += k if k < w else w
        return total

    def _decode_time(self, batch: int, kv_tokens: int, steps: int, window_kv: int = -1) -> float:
        if batch == 0:
            return 0.0
        # KV grows by `batch` tokens a step: price the run at its midpoint.
        mid_kv = kv_tokens + batch * (steps - 1) // 2
        return steps * self.cost.step_time(StepWork(decoders=batch, decode_kv=mid_kv, window_kv=window_kv))

    def _decode_run_length(self, n_dec: int, kv_tokens: int, now: float, horizon: float) -> int:
        steps = self._done_at[0][0] - self._tick  # until the first decoder finishes
        if horizon != float("inf") and steps > 1:
            one = self.cost.decode_step_time(n_dec, kv_tokens)
            if one > 0:
                steps = max(1, min(steps, int((horizon - now) / one)))
        return max(1, steps)

    # ---- speculative decoding (spec_decode.py) -----------------------------------------------
    @property
    def planned_drafts(self) -> list[tuple[SchedRequest, int]]:
        """This step's decoders and their drafts, from its planning until its verification (a step timer's view)."""
        return list(self._drafts)

    def _plan_drafts(self) -> None:
        """Each decoder's drafts this step: K, cut so its tokens stay within max_model_len (vLLM's proposer
        and its scheduler's length rule); their count and the context their queries attend."""
        k, cap, tick = self._spec_k, self.settings.max_model_len, self._tick
        plan = self._drafts
        plan.clear()
        total = kv = window_kv = 0
        w = self._window
        for r in self._decoders.values():
            tokens = r.input_tokens + tick - r.base
            d = k if not cap else max(0, min(k, cap - tokens - 1))
            plan.append((r, d))
            total += d
            kv += d * tokens
            window_kv += d * min(tokens, w)
        self._draft_tokens, self._draft_kv, self._draft_window_kv = total, kv, window_kv

    def _verify(self, result: StepResult) -> None:
        """The verify forward's outcome: each decoder keeps its accepted drafts and the token sampled after
        them, cut at its max_tokens; one that kept more than one token moves its decode tick (``base``) ahead,
        and its next block and next full block are due again (at the next step at the earliest)."""
        accept, tick, decode_kv = self.acceptance, self._tick, self.decode_kv
        assert accept is not None
        decode_kv.floor = tick + 1
        moved = False
        for r, d in self._drafts:
            a = 0
            if d:
                a = accept.accepted(r.rid, r.verifies, d)
                r.verifies += 1
                self.spec_verifies += 1
                self.spec_drafts += d
                self.spec_accepted += a
            kept = min(a + 1, r.output_tokens - (tick - r.base))
            if self.report_decoded:
                result.decoded.append((r, kept))
            if kept > 1:
                r.base -= kept - 1
                self._dec_base -= kept - 1
                decode_kv.retrack(r)
                moved = True
        self._drafts.clear()
        self._draft_tokens = self._draft_kv = self._draft_window_kv = 0
        if moved:  # finish ticks moved: the heap again, each request's entry keeping its order
            self._done_at = [(e[2].base + e[2].output_tokens, e[1], e[2]) for e in self._done_at]
            heapq.heapify(self._done_at)

    def _draft_time(self, kv_tokens: int, n_dec: int, completed: list[SchedRequest]) -> float:
        """The drafter's seconds after the forward: drafts for the decoders that go on and the requests whose
        prefill this step finished (shared/spec_cost.py)."""
        spec = self.settings.speculative
        assert spec is not None
        seqs = n_dec + len(completed)
        context = kv_tokens + sum(r.input_tokens for r in completed)
        return draft_seconds(self.cost, spec.method, spec.num_tokens, seqs, context)

    def spec_stats(self) -> dict:
        """Speculative decoding's counters and what vLLM logs of them: the mean accepted length (tokens a
        verification keeps, the sampled one included) and the draft acceptance rate."""
        v = self.spec_verifies
        return {"spec_verifies": v, "spec_draft_tokens": self.spec_drafts, "spec_accepted_tokens": self.spec_accepted,
                "spec_mean_accepted_length": 1 + self.spec_accepted / v if v else 0.0,
                "spec_acceptance_rate": self.spec_accepted / self.spec_drafts if self.spec_drafts else 0.0}


def _admit_seq(r: SchedRequest) -> int:
    return r.admit_seq
