"""Continuous-batching scheduler core: pure, synchronous, clock-agnostic.

Each step has a token budget (default 8192): every running request past its prefill
decodes one token, and the rest of the budget goes to prefill chunks in FCFS order
(chunked prefill). A waiting request is admitted only when the pool can allocate its
blocks (evicting unpinned blocks through the policy); its blocks stay pinned until it
finishes. A step is one forward over every token it schedules (vLLM v1): the cost model prices
its prefill chunks and its decoders together (``CostModel.step_time``: weights read once, the
fixed costs once, attention per sequence). The live replica sleeps each step's time
(times its time scale); the simulator advances a virtual clock by it. With nothing to
prefill, ``step`` may fast-forward several decode steps at once up to a horizon (the
next arrival), which is what lets a day of traffic run in seconds.

Two admission orders (``SchedulerSettings.policy``, ``--scheduler``): ``fcfs`` (vLLM)
admits strictly in arrival order, so a head that does not fit blocks the queue;
``reorder`` (FlashGen, Jeong and Ahn, ASPLOS 2025) then admits smaller requests behind it into the memory
that would sit idle, counts their blocks as reclaimable, and preempts them (recompute:
their blocks are released, they keep the tokens they generated and wait again in arrival
order) as soon as that lets the head run. A head waits only for the requests admitted in
order before it (the bound is in ``_reclaim_for``).

Where generated KV lives: with ``keep_response_kv`` (a colocated vLLM) a finished request's
full response blocks (``SchedRequest.response_hashes``, chained after its prompt) are cached,
so the next turn's prompt hits them; without it (a disaggregated prefill instance, as the
mean-field LRU analysis of multi-turn conversations assumes)
they are dropped and the next turn recomputes the response as new prompt blocks.

Decode KV takes blocks, as in vLLM (``decode_kv.DecodeBlocks``): a request is admitted with the
blocks its prompt fills (its partial last block too), and each decode step that crosses a block
boundary takes one more. Before a step, every decoding request gets the block it needs, oldest
admission first; when none is free or evictable, the most recently admitted running request is
preempted (recompute, as below; it may be the one that needed the block) until it fits, and no
request is admitted in that step (vLLM's recompute preemption, under ``fcfs`` and ``reorder``
alike). A request longer than ``max_model_len`` (prompt plus max_tokens, vLLM's length rule), or
whose prompt and output could never fit the pool, is refused at ``submit``. How a request enters, from
the queue or (P/D's decode side, vLLM's ``WAITING_FOR_REMOTE_KVS``) with its KV computed elsewhere
(``reserve_remote``, ``remote_arrived``, ``cancel_remote``), is one bookkeeping: admission.py.

A request whose client went away is aborted (``abort``, vLLM's abort): it leaves the scheduler
wherever it is and never finishes; its blocks go back as vLLM frees them (what it computed stays
cached, evictable; the prompt blocks its prefill had not finished leave the pool). How a request leaves,
finished, preempted or aborted, is one bookkeeping too: release.py.

With memory tiers (``tiers``), every acquisition is wrapped: ``TierStack.plan`` before it (what
host / SSD restore), ``complete`` after it (transfers queued; restored blocks count as reused),
``cancel`` when it fails; a restore overlaps the step that prefills the request, layer by layer
(``costmodel.layered_finish``: the step takes the larger of its compute and the transfers it waits on).
"""

from __future__ import annotations

from collections import deque

from mypy_extensions import mypyc_attr

from replica.core.cache.grouped import GroupedPool
from replica.core.cache.pool import PoolBusyError
from replica.core.cache.types import ResponseStore, SchedulerPool
from replica.core.sched.decode_kv import DecodeBlocks
from replica.core.sched.decoding import Decoding
from replica.core.sched.sched_types import (
    ADMISSIONS,
    SCHEDULERS,
    QueueFullError,
    SchedRequest,
    SchedulerSettings,
    StepResult,
    StepTimer,
    check_admission,
)
from replica.core.sched.spec_decode import Acceptance
from replica.core.sched.v0_steps import StepBudget
from replica.core.tiers.stack import FetchPlan, TierStack
from shared.costmodel import CostModel, StepWork, layered_finish
from shared.model_kinds import window_pairs

__all__ = ["ADMISSIONS", "SCHEDULERS", "QueueFullError", "SchedRequest", "Scheduler", "SchedulerSettings", "StepResult",
           "StepTimer", "check_admission"]

@mypyc_attr(allow_interpreted_subclasses=True)  # compiled by mypyc (shared/compiled_modules.py); tests subclass it
class Scheduler(Decoding):
    """Work per step is proportional to what changes (admissions, prefill chunks, finishing
    requests), not to the number of running requests: decoding requests share one decode
    counter (``_tick``), and each is kept in a heap by the tick at which it finishes, so a
    step costs O(changes + log running). ``report_decoded`` (the live replica streams tokens)
    adds the per-decoder token counts to each step's result, which is O(decoders) by nature.

    ``reorder`` keeps that: a blocked head's reclaim check and the scan for requests to admit
    behind it run only after something changed (a release, an admission, an arrival), and cost
    O(lent blocks + window x prompt); a preemption costs O(running) (it leaves the decode heap).
    """

    def __init__(self, pool: SchedulerPool, cost: CostModel, settings: SchedulerSettings | None = None,
                 *, report_decoded: bool = True, tiers: TierStack | None = None,
                 keep_response_kv: bool = False) -> None:
        self.pool = pool
        self.tiers = tiers
        self.keep_response_kv = keep_response_kv
        self._store = pool if isinstance(pool, ResponseStore) else None  # decided once (isinstance costs µs)
        self._groups = pool if isinstance(pool, GroupedPool) else None  # KV cache groups (cache/grouped.py)
        self.cost = cost
        self._window = cost.window  # sliding-window layers read each context up to it (StepWork's window fields)
        self.settings = settings or SchedulerSettings()
        self.report_decoded = report_decoded
        self.waiting: deque[SchedRequest] = deque()
        self.prefilling: deque[SchedRequest] = deque()  # admitted, prefill not done; FCFS
        self.queued_prefill_tokens = 0
        # Decoders: request r has generated ``_tick - r.base`` tokens; it is done at tick
        # ``r.base + r.output_tokens``. The aggregates give the batch's KV size in O(1).
        self._tick = 0
        self._done_at = []  # (finish tick, rid order, request)
        self._decoders = {}  # id(request) -> request, for report_decoded
        self._seq = 0
        self._dec_input = 0  # sum of input_tokens over decoders
        self._dec_base = 0  # sum of base over decoders
        # where response KV is kept, the blocks decoding fills are hashed as they fill (``_fill_due``)
        spec = self.settings.speculative
        # speculative decoding (spec_decode.py): a decoder's K drafts take slots, its kept tokens are drawn
        self._spec_k = spec.num_tokens if spec is not None else 0
        self.acceptance: Acceptance | None = spec.model() if spec is not None else None
        self.decode_kv = self._decode_blocks(pool, keep_response_kv)
        self._drafts: list[tuple[SchedRequest, int]] = []  # this step's decoders and their drafts
        self._draft_tokens = 0  # their drafts, in all
        self._draft_kv = 0  # sum of drafts x context tokens
        self._draft_window_kv = 0  # ... x context tokens up to the window
        self.spec_verifies = 0  # verifications (decoder-steps with drafts)
        self.spec_drafts = 0  # draft tokens verified
        self.spec_accepted = 0  # ... of them accepted
        # Statistics (``stats``); admission's own (refused, admissions, waits, prefill tokens): admission.py;
        # preemptions, with what leaving keeps (on_preempt, the private copies of filled blocks): release.py
        self._init_admission()
        self._init_release(pool)
        self.promotions = 0  # admissions out of arrival order (reorder)
        self.pinned_block_s = 0.0  # blocks held by running requests x step time: time-averaged HBM use
        self.queued_block_s = 0.0  # ... over the steps that began with requests waiting (FlashGen's idle memory)
        self.queued_s = 0.0  # seconds of those steps
        self.blocked_block_s = 0.0  # ... over the steps whose queue head waited for memory (not for a step's room)
        self.blocked_s = 0.0
        self._blocked = False  # this step's head could not be allocated
        self._v0: StepBudget | None = None  # step_rule v0: what this step's admissions may still prefill
        self.batch_steps = 0  # running requests x steps: over ``steps``, the mean batch size
        self.steps = 0
        # reorder: requests admitted ahead of a blocked head (by order), the heap of their orders
        # (lazy: stale entries are skipped) and how many of them pin each block.
        self._promoted: dict[int, SchedRequest] = {}
        self._promoted_orders: list[int] = []
        self._lent: dict[int, int] = {}
        self._dirty = True  # something changed since a blocked head was last looked at
        self.timer = None  # a real backend times the steps (see StepTimer)
        self._chunks: list[tuple[SchedRequest, int, int]] = []  # (request, start, tokens) of this step, for it
        self._restoring: list[FetchPlan] = []  # the restores this step's chunks wait on (tiers)
        self._now = 0.0  # the start of the step being planned

    def _decode_blocks(self, pool: SchedulerPool, keep_response_kv: bool) -> DecodeBlocks:
        """The blocks decoders take as they grow, with the draft slots speculative decoding reserves."""
        spec = self.settings.speculative
        mml = self.settings.max_model_len
        return DecodeBlocks(pool, self.settings.decode_kv, fills=keep_response_kv and self._store is not None,
                            draft_slots=self._spec_k + spec.lookahead if spec is not None else 0,
                            admit_slots=spec.lookahead if spec is not None else 0,
                            cap=(mml - (0 if spec.lookahead else 1)) if spec is not None and mml else 0)

    # ---- queue (submit, and reserve_remote for KV computed elsewhere: admission.py) ----------
    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self._done_at)

    @property
    def num_running(self) -> int:
        return len(self.prefilling) + len(self._done_at)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def running(self) -> list[SchedRequest]:
        """Admitted requests (prefilling first, then decoding), for inspection only."""
        return [*self.prefilling, *(entry[2] for entry in self._done_at)]

    # ---- one step ---------------------------------------------------------------
    def step(self, now: float, horizon: float = float("inf")) -> StepResult:
        """Plan and account one step starting at ``now`` (or several decode-only steps
        ending no later than ``horizon``). The caller waits ``duration`` afterwards."""
        self._now = now
        self._blocked = False
        decoding = self._begin(now)
        queued = bool(self.waiting)
        n_dec = len(self._done_at) if decoding else 0
        spec = self._spec_k > 0 and n_dec > 0
        budget = self.settings.token_budget - n_dec - (self._draft_tokens if spec else 0)
        kv_tokens = self._dec_input + n_dec * self._tick - self._dec_base if n_dec else 0
        work, restores, completed = self._prefill_chunks(budget, now, n_dec, kv_tokens)
        prefill_tokens = work.prefill_tokens
        steps = 1
        if spec:  # the verify forward: each decoder's sampled token and its drafts (one step at a time)
            work = work._replace(draft_tokens=self._draft_tokens, draft_kv=self._draft_kv,
                                 window_draft_kv=self._draft_window_kv)
        elif prefill_tokens == 0 and n_dec:  # windows free what a run passed at the next step (_grow_now's slides)
            steps = self._decode_run_length(n_dec, kv_tokens, now, horizon)
            if steps > 1:
                steps = self.decode_kv.ahead(self._tick, steps)
                self._fill_due(self._tick + steps - 1, now)  # no request looks up before the run ends
        tiers = self.tiers
        if prefill_tokens or spec:  # one forward over the chunks and the decode tokens
            duration = self.cost.step_time(work)
            if tiers is not None:  # the links it shares: its all-reduce over PCIe, then its restores' ends
                duration = tiers.all_reduce(now, duration, work.tokens)
                if self._restoring:
                    restores = tiers.windows(self._restoring, now)
                    self._restoring = []
            if restores:
                duration = layered_finish(duration, restores, self.cost.model.layers)
            if self._spec_k:  # the drafter proposes the next step's drafts for those that will decode
                duration += self._draft_time(kv_tokens if spec else 0, n_dec, completed)
        else:
            duration = self._decode_time(n_dec, kv_tokens, steps, work.window_kv if steps == 1 else -1)
            if tiers is not None:
                duration = tiers.all_reduce(now, duration, n_dec * steps)
        self._account(duration, queued, steps)
        if self.timer is not None:
            duration = self.timer.step_time(self._chunks, list(self._decoders.values()), steps, duration)
            self._chunks = []
        end = now + duration
        result = StepResult(now, duration, steps, prefill_tokens, [], [], [])
        if n_dec:
            if spec:
                self._verify(result)
            elif self.report_decoded:
                tick = self._tick
                result.decoded = [(r, min(steps, r.base + r.output_tokens - tick)) for r in self._decoders.values()]
            self._tick += steps
            self.decode_kv.floor = self._tick
            self._retire(result, end)
        self._complete(completed, result, end)
        return result

    def _account(self, duration: float, queued: bool, steps: int) -> None:
        """A step's share of the time-averaged memory figures (``stats``) and of the batch-size mean."""
        held = (self.pool.pinned + self.pool.private) * duration
        self.pinned_block_s += held
        if queued:
            self.queued_block_s += held
            self.queued_s += duration
        if self._blocked:
            self.blocked_block_s += held
            self.blocked_s += duration
        self.batch_steps += self.num_running * steps
        self.steps += steps

    def _begin(self, now: float) -> bool:
        """What a step does before its chunks: decoders get the blocks they need (preempting when none is
        left) and hash the blocks they fill, then waiting requests are admitted. Whether the step decodes."""
        if self.settings.step_rule == "v0":  # a step prefills or decodes (v0_steps)
            if self._v0_admit(now):
                return False
            self._grow_now(now)
            self._fill_due(self._tick, now)
            return True
        self.decode_kv.floor = self._tick
        preempted = self._grow_now(now)
        self._fill_due(self._tick, now)  # before admissions: they may hit what decoding just filled
        if self._spec_k:
            self._plan_drafts()
        if self._groups is not None:
            preempted = self._extend_running() or preempted
        if not preempted:  # vLLM admits nothing in a step that preempted
            self._admit(now)
        return True

    def _complete(self, completed: list[SchedRequest], result: StepResult, end: float) -> None:
        """Requests whose prefill this step finished: each samples a token (its first, or the next one
        of a request recomputed after a preemption: vLLM's prefill of prompt and output yields one)."""
        for r in completed:
            if r.resumed:  # no second first token
                r.generated += 1
                if self.report_decoded:
                    result.decoded.append((r, 1))
            else:
                r.t_first_token = end
                r.generated = 1
                result.first_tokens.append(r)
            if r.generated >= r.output_tokens:
                self._release(r, result, end)
            else:
                self._add_decoder(r)

    def stats(self) -> dict:
        """Counters since start: what /stats, /metrics and the simulator report."""
        # "policy" is the admission order here: the key /stats and the sim JSON have always shown
        return {"policy": self.settings.admission, "admissions": self.admissions, "promotions": self.promotions,
                "preemptions": self.preemptions, "refused": self.refused,
                "queue_wait_s_total": self.queue_wait_s,
                "prefill_tokens": self.prefill_tokens, "readmission_prefill_tokens": self.readmission_prefill_tokens,
                "pinned_block_s": self.pinned_block_s, "queued_block_s": self.queued_block_s,
                "queued_s": self.queued_s, "blocked_block_s": self.blocked_block_s, "blocked_s": self.blocked_s,
                "batch_steps": self.batch_steps, "steps": self.steps, **(self.spec_stats() if self._spec_k else {})}

    def _admit(self, now: float) -> None:
        max_running = self.settings.max_running
        reorder = self.settings.admission == "reorder"
        # vLLM schedules a waiting request only while the step's token budget has room after the running
        # requests' tokens (a decode each, the rest of their prefills): one admitted beyond it would hold
        # its blocks, and look up its hits, steps before it computes anything. reorder (FlashGen) admits
        # into idle memory whatever the budget, as it always has.
        left = self.settings.token_budget - len(self._done_at) - self._draft_tokens \
            - self._prefill_demand(self.settings.token_budget) if not reorder else 1
        v0 = self._v0  # v0: whole prompts within the step's budget, decoders not counted (a prefill step)
        if v0 is not None:
            left = v0.left
        while self.waiting and self.num_running < max_running and left > 0:
            req = self.waiting[0]
            if v0 is not None and not v0.takes(req):
                break
            if self._groups is not None:  # its first chunk's blocks are checked with its admission (vLLM's)
                self._groups.chunk_tokens = left
            try:
                self._acquire(req, now)
            except PoolBusyError:
                self._blocked = True  # the head waits for memory
                if self._groups is not None:
                    self._groups.chunk_tokens = None
                # FCFS: the head waits for running requests to free blocks. Reorder: take back
                # lent memory if that lets it run, else lend what is idle to requests behind it.
                if reorder and self._dirty:
                    self._dirty = False
                    if self._reclaim_for(req, now):
                        continue
                    self._promote(now)
                break
            self.waiting.popleft()
            self._start(req, now)
            if self._groups is not None:  # its first chunk's blocks, as vLLM allocates them at admission
                self._groups.chunk_tokens = None
                self._extend(req, req.segments[0][0] + self._chunk(req, req.segments[0][0], min(req.segments[0][1], left)),
                             now)
            if not reorder:
                left -= self._demand(req, left)
            if self._promoted:
                self._catch_up()

    def _v0_admit(self, now: float) -> bool:
        """vLLM v0's step (``v0_steps``): admit whole prompts while the step's budget holds them; True:
        this step prefills them (nothing decodes), False: it decodes."""
        if not self.prefilling:  # nothing is left over: a v0 step prefills whole prompts
            self._v0 = StepBudget(self.settings.token_budget)
            self._admit(now)
            self._v0 = None
        return bool(self.prefilling)

    def _prefill_chunks(self, budget: int, now: float, decoders: int,
                        decode_kv: int) -> tuple[StepWork, list[tuple[float, float]], list[SchedRequest]]:
        """FCFS chunks up to ``budget`` tokens: what they compute with the step's ``decoders``
        (``StepWork``: one forward over both),
        the restores from lower tiers they wait on ((start, ready) from ``now``: the step
        overlaps them layer by layer), and the requests they complete (a prefix of the queue)."""
        tokens = seqs = cached = w_cached = 0
        pairs = w_pairs = 0.0
        window = self._window
        restores: list[tuple[float, float]] = []
        completed = []
        queue = self.prefilling
        timed = self.timer is not None
        groups = self._groups
        for r in queue:
            if tokens >= budget:
                break
            segments = r.segments
            seqs += 1  # one sequence of the forward, whatever holes its chunk spans
            take = want = 0
            while segments and tokens < budget:
                seg = segments[0]
                c = seg[0]
                want = min(seg[1], budget - tokens)
                take = self._chunk(r, c, want)  # a state group's chunk ends where a state is kept: the rest waits
                if not take or groups is not None and not self._extend(r, c + take, now):
                    break
                # each range's queries attend over everything before it (holes: the hits around them)
                tokens += take
                cached += c
                pairs += take * c + take * (take - 1) / 2
                if window:  # a window layer's queries attend at most the window before them
                    w_pairs += window_pairs(take, c, window)
                    w_cached += min(c, window)
                if timed:
                    self._chunks.append((r, c, take))
                seg[0] += take
                seg[1] -= take
                if seg[1] == 0:
                    segments.pop(0)
                if take < want:
                    break
            if r.ready_at:
                if r.plan is not None:  # its transfers' ends are projected once the step's are known
                    self._restoring.append(r.plan)
                    r.plan = None
                elif r.ready_at > now:
                    restores.append((r.restore_start - now, r.ready_at - now))
                r.ready_at = 0.0
            if segments:
                if take < want:  # cut by a state group: the requests behind it take their chunks
                    continue
                break
            completed.append(r)
        for r in completed:  # a prefix of the queue, but for those behind a state group's cut
            queue.popleft() if queue[0] is r else queue.remove(r)
        self.queued_prefill_tokens -= tokens
        return StepWork(tokens, seqs, pairs, cached, decoders, decode_kv, window_pairs=w_pairs, window_cached=w_cached,
                        window_kv=self._window_kv(decoders) if window else 0), restores, completed
