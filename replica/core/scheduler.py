"""Continuous-batching scheduler core: pure, synchronous, clock-agnostic.

Each step has a token budget (default 8192): every running request past its prefill
decodes one token, and the rest of the budget goes to prefill chunks in FCFS order
(chunked prefill). A waiting request is admitted only when the pool can allocate its
blocks (evicting unpinned blocks through the policy); its blocks stay pinned until it
finishes. Step time comes from the cost model. The live replica sleeps each step's time
(times its time scale); the simulator advances a virtual clock by it. With nothing to
prefill, ``step`` may fast-forward several decode steps at once up to a horizon (the
next arrival), which is what lets a day of traffic run in seconds.

Only prompt blocks are cache blocks: the KV of generated tokens is not hashed or kept
(as on a disaggregated prefill instance, seed 000); the next turn's prompt carries the
response as new prompt blocks.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from replica.core.pool import Allocation, BlockPool, PoolBusyError, PoolCapacityError
from shared.costmodel import CostModel
from shared.errors import KvemuError
from shared.validate import check_positive_int


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    token_budget: int = 8192
    max_running: int = 256
    max_waiting: int = 100_000

    def __post_init__(self) -> None:
        for name in ("token_budget", "max_running", "max_waiting"):
            check_positive_int(name, getattr(self, name))


@dataclass(slots=True)
class SchedRequest:
    rid: int
    hashes: Sequence[int]
    input_tokens: int
    output_tokens: int
    arrival: float
    session: str | None = None
    next_use: Sequence[float] | None = None
    position: float | None = None  # oracles: the request's place in the access order (see next_use)
    # filled in by the scheduler
    alloc: Allocation | None = None
    segments: list[list[int]] = field(default_factory=list)  # [start_token, tokens] left to prefill
    cached_tokens: int = 0
    generated: int = 0  # exact once the request finished; while decoding see Scheduler._tick
    base: int = 0  # decode tick at which generated would have been 0 (the scheduler's bookkeeping)
    t_admitted: float = -1.0
    t_first_token: float = -1.0
    t_finished: float = -1.0

    @property
    def prefilling(self) -> bool:
        return bool(self.segments)


@dataclass(slots=True)
class StepResult:
    start: float
    duration: float
    steps: int
    prefill_tokens: int
    first_tokens: list[SchedRequest]
    finished: list[SchedRequest]
    decoded: list[tuple[SchedRequest, int]]  # (request, tokens generated in this step(s))


class StepTimer(Protocol):
    """A compute backend that runs a step's work for real and says how long it took (the torch
    backend, replica/backends/); without one the step costs what the cost model says."""

    def step_time(self, chunks: list[tuple[SchedRequest, int, int]], decoders: list[SchedRequest], steps: int,
                  modelled: float) -> float: ...


class QueueFullError(KvemuError):
    """Overload, not bad input: answered 503 with Retry-After so a router tries elsewhere."""

    def __init__(self, limit: int):
        super().__init__(f"waiting queue is full ({limit} requests)")


class Scheduler:
    """Work per step is proportional to what changes (admissions, prefill chunks, finishing
    requests), not to the number of running requests: decoding requests share one decode
    counter (``_tick``), and each is kept in a heap by the tick at which it finishes, so a
    step costs O(changes + log running). ``report_decoded`` (the live replica streams tokens)
    adds the per-decoder token counts to each step's result, which is O(decoders) by nature.
    """

    def __init__(self, pool: BlockPool, cost: CostModel, settings: SchedulerSettings | None = None,
                 *, report_decoded: bool = True) -> None:
        self.pool = pool
        self.cost = cost
        self.settings = settings or SchedulerSettings()
        self.report_decoded = report_decoded
        self.waiting: deque[SchedRequest] = deque()
        self.prefilling: deque[SchedRequest] = deque()  # admitted, prefill not done; FCFS
        self.queued_prefill_tokens = 0
        # Decoders: request r has generated ``_tick - r.base`` tokens; it is done at tick
        # ``r.base + r.output_tokens``. The aggregates give the batch's KV size in O(1).
        self._tick = 0
        self._done_at: list[tuple[int, int, SchedRequest]] = []  # (finish tick, rid order, request)
        self._decoders: dict[int, SchedRequest] = {}  # id(request) -> request, for report_decoded
        self._seq = 0
        self._dec_input = 0  # sum of input_tokens over decoders
        self._dec_base = 0  # sum of base over decoders
        self.timer: StepTimer | None = None  # a real backend times the steps (see StepTimer)
        self._chunks: list[tuple[SchedRequest, int, int]] = []  # (request, start, tokens) of this step, for it

    # ---- queue ------------------------------------------------------------------
    def submit(self, req: SchedRequest) -> None:
        if len(self.waiting) >= self.settings.max_waiting:
            raise QueueFullError(self.settings.max_waiting)
        if len(req.hashes) > self.pool.capacity:
            raise PoolCapacityError(len(req.hashes), self.pool.capacity)
        self.waiting.append(req)
        self.queued_prefill_tokens += req.input_tokens

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
        self._admit(now)
        n_dec = len(self._done_at)
        budget = self.settings.token_budget - n_dec
        prefill_time, prefill_tokens, completed = self._prefill_chunks(budget)
        kv_tokens = self._dec_input + n_dec * self._tick - self._dec_base
        steps = 1
        if prefill_tokens == 0 and n_dec:  # nothing admissible until a request finishes
            steps = self._decode_run_length(n_dec, kv_tokens, now, horizon)
        decode_time = self._decode_time(n_dec, kv_tokens, steps)
        duration = prefill_time + decode_time
        if self.timer is not None:
            duration = self.timer.step_time(self._chunks, list(self._decoders.values()), steps, duration)
            self._chunks = []
        end = now + duration
        result = StepResult(now, duration, steps, prefill_tokens, [], [], [])
        if n_dec:
            if self.report_decoded:
                tick = self._tick
                result.decoded = [(r, min(steps, r.base + r.output_tokens - tick)) for r in self._decoders.values()]
            self._tick += steps
            self._retire(result, end)
        for r in completed:
            r.t_first_token = end
            r.generated = 1
            result.first_tokens.append(r)
            if r.output_tokens <= 1:
                self._release(r, result, end)
            else:
                self._add_decoder(r)
        return result

    def _admit(self, now: float) -> None:
        max_running = self.settings.max_running
        while self.waiting and self.num_running < max_running:
            req = self.waiting[0]
            try:
                req.alloc = self.pool.acquire(
                    req.hashes, session=req.session, now=now, input_tokens=req.input_tokens, next_use=req.next_use,
                    position=req.position)
            except PoolBusyError:
                break  # FCFS: the head waits for running requests to free blocks
            self.waiting.popleft()
            req.t_admitted = now
            req.cached_tokens = min(len(req.alloc.hit_idx) * self.pool.block_size, req.input_tokens)
            req.segments = _prefill_segments(req, self.pool.block_size)
            self.queued_prefill_tokens -= req.input_tokens - sum(s[1] for s in req.segments)
            self.prefilling.append(req)

    def _prefill_chunks(self, budget: int) -> tuple[float, int, list[SchedRequest]]:
        """FCFS chunks up to ``budget`` tokens; the requests it completes are a prefix of the queue."""
        time_s = 0.0
        used = 0
        completed = []
        prefill_time = self.cost.prefill_time
        queue = self.prefilling
        for r in queue:
            if used >= budget:
                break
            segments = r.segments
            while segments and used < budget:
                seg = segments[0]
                take = min(seg[1], budget - used)
                time_s += prefill_time(take, seg[0])
                if self.timer is not None:
                    self._chunks.append((r, seg[0], take))
                seg[0] += take
                seg[1] -= take
                used += take
                if seg[1] == 0:
                    segments.pop(0)
            if segments:
                break
            completed.append(r)
        for _ in completed:
            queue.popleft()
        self.queued_prefill_tokens -= used
        return time_s, used, completed

    def _add_decoder(self, r: SchedRequest) -> None:
        r.base = self._tick - r.generated
        self._seq += 1
        heapq.heappush(self._done_at, (r.base + r.output_tokens, self._seq, r))
        self._decoders[id(r)] = r
        self._dec_input += r.input_tokens
        self._dec_base += r.base

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

    def _release(self, r: SchedRequest, result: StepResult, end: float) -> None:
        r.t_finished = end
        assert r.alloc is not None  # admitted requests hold an allocation
        self.pool.release(r.alloc, end)
        result.finished.append(r)

    def _decode_time(self, batch: int, kv_tokens: int, steps: int) -> float:
        if batch == 0:
            return 0.0
        # KV grows by `batch` tokens a step: price the run at its midpoint.
        mid_kv = kv_tokens + batch * (steps - 1) // 2
        return steps * self.cost.decode_step_time(batch, mid_kv)

    def _decode_run_length(self, n_dec: int, kv_tokens: int, now: float, horizon: float) -> int:
        steps = self._done_at[0][0] - self._tick  # until the first decoder finishes
        if horizon != float("inf") and steps > 1:
            one = self.cost.decode_step_time(n_dec, kv_tokens)
            if one > 0:
                steps = max(1, min(steps, int((horizon - now) / one)))
        return max(1, steps)


def _prefill_segments(req: SchedRequest, block_size: int) -> list[list[int]]:
    """Token ranges to compute: missed blocks (holes included) and the partial tail."""
    assert req.alloc is not None
    hit_idx = req.alloc.hit_idx
    n_blocks = len(req.hashes)
    segments: list[list[int]] = []
    prev = -1  # gaps between consecutive reused blocks are the holes to recompute
    if hit_idx and hit_idx[-1] != len(hit_idx) - 1:
        for i in hit_idx:
            if i > prev + 1:
                segments.append([(prev + 1) * block_size, (i - prev - 1) * block_size])
            prev = i
    else:
        prev = len(hit_idx) - 1  # a leading run (or nothing) reused: one range after it
    end = n_blocks * block_size + max(req.input_tokens - n_blocks * block_size, 0)  # + the partial tail
    start = (prev + 1) * block_size
    if end > start:
        segments.append([start, end - start])
    if not segments:
        # Everything cached: the last prompt token is still run to produce logits (vLLM).
        segments.append([max(req.input_tokens - 1, 0), 1])
    return segments
