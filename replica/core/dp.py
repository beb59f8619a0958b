"""A data-parallel group: ``--data-parallel-size N`` ranks behind one instance, as vLLM runs them.

Each rank is a whole core (its own scheduler and KV pool, built by ``build.build_core``); the group
gives a request to a rank as vLLM's DP coordinator does (``DPLBAsyncMPClient``: the rank with the least
``waiting x 4 + running``, ties to the lowest rank), unless the request names one (vLLM's
``X-data-parallel-rank`` header). Pure and synchronous like the rest of the core.

Without expert parallelism the ranks are independent engines that step on their own (vLLM: no
lockstep); the caller steps each rank's scheduler. With ``--enable-expert-parallel`` on a MoE model the
ranks step in lockstep (``lockstep_step``): every rank runs its batch, or vLLM's dummy batch of one token
when it has none while another rank has work (``DPEngineCoreProc``: ``execute_dummy_batch`` while
``_has_global_unfinished_reqs``), and the step takes the slowest rank's time plus the all-to-alls of
its MoE layers (``shared.expert_parallel``). Each rank's scheduler still plans its own step (admission,
chunks, decode); the group then prices the step and moves every rank's step end to the group's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from replica.core.build import ReplicaCore
from replica.core.sched.scheduler import SchedRequest, Scheduler, StepResult
from shared.costmodel import CostModel, StepWork
from shared.errors import InputError
from shared.expert_parallel import DUMMY_WORK, ExpertParallel
from shared.validate import check_positive_int

WAITING_WEIGHT = 4  # vLLM's coordinator: a rank's load is waiting x 4 + running


@dataclass(frozen=True, slots=True)
class DpSettings:
    """``size`` ranks; ``expert_parallel``: a MoE model's experts split over them, stepping in lockstep."""

    size: int = 1
    expert_parallel: bool = False

    def __post_init__(self) -> None:
        check_positive_int("data_parallel_size", self.size)
        if self.expert_parallel and self.size < 2:
            raise InputError("enable_expert_parallel", "needs data_parallel_size 2 or more")

    @property
    def lockstep(self) -> bool:
        return self.expert_parallel and self.size > 1

    def expert_ranks(self, tp: int) -> int:
        """The GPUs each expert layer is split over, for the memory rule: DP x TP under expert parallelism, else 0
        (the --tp GPUs, as the rest of the weights)."""
        return self.size * tp if self.expert_parallel else 0


def rank_load(sched: Scheduler) -> int:
    """What vLLM's DP coordinator balances on: waiting x 4 + running."""
    return sched.num_waiting * WAITING_WEIGHT + sched.num_running


def pick_rank(scheds: Sequence[Scheduler], asked: int | None = None, field: str = "X-data-parallel-rank") -> int:
    """The rank named (checked), else the least loaded, ties to the lowest."""
    if asked is not None:
        if not 0 <= asked < len(scheds):
            raise InputError(field, f"must be a rank from 0 to {len(scheds) - 1}, got {asked}")
        return asked
    loads = [rank_load(s) for s in scheds]
    return loads.index(min(loads))


class _WorkRecorder:
    """A rank scheduler's ``StepTimer`` under lockstep: notes what the step computes (the group prices it)
    and keeps the modelled time."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.work: StepWork | None = None

    def step_time(self, chunks: list[tuple[SchedRequest, int, int]], decoders: list[SchedRequest], steps: int,
                  modelled: float) -> float:
        tick = self.sched._tick  # a decoder holds input_tokens + (tick - base) tokens: the scheduler's own sum
        kv = sum(r.input_tokens + tick - r.base for r in decoders)
        w = self.sched.cost.window  # a window layer reads each context up to its window
        window_kv = sum(min(r.input_tokens + tick - r.base, w) for r in decoders) if w else -1
        self.work = StepWork.of(((take, start) for _, start, take in chunks), len(decoders), kv, w, window_kv)
        return modelled

    def stored(self, r: SchedRequest, hashes: list[int]) -> None:
        """No K/V to give: the emulated backend."""


@dataclass(slots=True)
class LockstepStep:
    """One lockstep step: each rank's result (None: it ran a dummy batch or nothing), the seconds each rank's
    compute took, the all-to-alls', and the step's whole duration."""

    start: float
    duration: float
    results: list[StepResult | None]
    rank_s: list[float]
    all_to_all_s: float

    @property
    def dummies(self) -> int:
        return sum(1 for r in self.results if r is None or r.duration <= 0)


class DpGroup:
    """``settings.size`` cores behind one instance (see the module docstring)."""

    def __init__(self, ranks: Sequence[ReplicaCore], cost: CostModel, settings: DpSettings) -> None:
        if len(ranks) != settings.size:
            raise InputError("data_parallel_size", f"{settings.size} ranks asked, {len(ranks)} built")
        self.ranks = list(ranks)
        self.settings = settings
        self.pricing = ExpertParallel(cost, settings.size) if settings.lockstep else None
        self._recorders: list[_WorkRecorder] = []
        if self.pricing is not None:
            for core in self.ranks:
                if core.scheduler.timer is not None:
                    raise InputError("backend", "expert parallelism runs on the emulated backend only")
                recorder = _WorkRecorder(core.scheduler)
                core.scheduler.timer = recorder
                self._recorders.append(recorder)
        self.routed = [0] * settings.size  # requests each rank was given

    @property
    def schedulers(self) -> list[Scheduler]:
        return [core.scheduler for core in self.ranks]

    def pick(self, asked: int | None = None) -> int:
        return pick_rank(self.schedulers, asked)

    def submit(self, req: SchedRequest, asked: int | None = None) -> int:
        """Queue ``req`` on the rank named or the least loaded; returns the rank (the scheduler's refusals
        propagate, the rank's count unchanged)."""
        rank = self.pick(asked)
        self.ranks[rank].scheduler.submit(req)
        self.routed[rank] += 1
        return rank

    def has_work(self) -> bool:
        return any(core.scheduler.has_work() for core in self.ranks)

    def lockstep_step(self, now: float) -> LockstepStep:
        """Every rank's next step at ``now``, in lockstep (one step each: no decode run ahead, the ranks
        meet at every MoE layer). A duration of 0 when no rank could run anything."""
        pricing = self.pricing
        assert pricing is not None, "lockstep is expert parallelism's"
        results: list[StepResult | None] = []
        works: list[StepWork | None] = []
        for core, recorder in zip(self.ranks, self._recorders, strict=True):
            recorder.work = None
            sched = core.scheduler
            res = sched.step(now, now) if sched.has_work() else None  # horizon now: one step
            results.append(res)
            works.append(recorder.work if res is not None and res.duration > 0 else None)
        if all(w is None for w in works):
            return LockstepStep(now, 0.0, results, [0.0] * len(works), 0.0)
        tokens = [w.tokens if w is not None else DUMMY_WORK.tokens for w in works]
        group = sum(tokens)
        rank_s = []
        for res, work in zip(results, works, strict=True):
            if work is None or res is None:
                rank_s.append(pricing.dummy_step_s(group))
            else:  # the scheduler's time (tiers, restores) moved by what expert parallelism changes
                rank_s.append(res.duration + pricing.rank_step_s(work, group) - pricing.cost.step_time(work))
        a2a = pricing.all_to_all_s(max(tokens))
        step = LockstepStep(now, max(rank_s) + a2a, results, rank_s, a2a)
        for res in results:
            if res is not None:
                _retime(res, step.duration)
        return step

    def stats(self) -> list[dict]:
        """Per rank: requests given, waiting, running, and its pool's KV use and hit ratio."""
        out = []
        for rank, core in enumerate(self.ranks):
            pool, sched = core.pool, core.scheduler
            m = pool.metrics
            out.append({"dp_rank": rank, "routed": self.routed[rank], "waiting": sched.num_waiting,
                        "running": sched.num_running, "kv_usage": pool.usage(),
                        "block_hit_ratio": m.counts().block_hit_ratio})
        return out


def _retime(res: StepResult, duration: float) -> None:
    """A rank's step ends when the group's does: its first tokens and finished requests with it."""
    res.duration = duration
    end = res.start + duration
    for r in res.first_tokens:
        r.t_first_token = end
    for r in res.finished:
        r.t_finished = end
