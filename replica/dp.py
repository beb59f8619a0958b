"""Data-parallel ranks in one live replica (``--data-parallel-size N``), as vLLM runs them behind one API server.

The ranks are the simulator's: one ``DpGroup`` (replica/core/dp.py) of whole cores, each its own scheduler and KV
pool, a request given to the rank it names (vLLM's ``X-data-parallel-rank``) or to the least loaded by waiting x 4
+ running. How they step follows vLLM's engine cores:

* without expert parallelism each rank is its own ``Engine`` with its own loop and clock (vLLM: one engine core
  process a rank, no lockstep), so a rank's steps never wait for another's;
* with ``--enable-expert-parallel`` one ``Engine`` steps every rank together (``LockstepScheduler``: the group's
  ``lockstep_step``, an idle rank's dummy batch and the all-to-alls of its MoE layers), one clock for all.

Either way each rank's KV events leave tagged with its rank (``on_rank_events``): kvemu's feed numbers them per
rank for the index, and vLLM's publisher of that rank sends them with its ``data_parallel_rank``."""

from __future__ import annotations

import asyncio
import heapq
from collections import Counter
from collections.abc import Callable, Sequence

from replica.core.build import ReplicaCore
from replica.core.cache.pool import KvEvent
from replica.core.dp import DpGroup, DpSettings
from replica.core.sched.scheduler import SchedRequest, StepResult
from replica.engine import INF, Engine, EngineCounters, Handle
from shared.costmodel import CostModel
from shared.ratios import ratio

RankEvents = Callable[[int, list[KvEvent]], None]


class LockstepScheduler:
    """An expert-parallel group's ranks as the one thing an ``Engine`` steps: each step is the group's lockstep
    step, its result every rank's requests together."""

    def __init__(self, group: DpGroup) -> None:
        self.group = group
        self._rank_of: dict[int, int] = {}  # request id -> its rank, while it is in the group

    def submit(self, req: SchedRequest, rank: int) -> None:
        self.group.ranks[rank].scheduler.submit(req)
        self._rank_of[req.rid] = rank

    def has_work(self) -> bool:
        return self.group.has_work()

    def step(self, now: float, horizon: float = INF) -> StepResult:
        """One lockstep step (never a run of decode steps: the ranks meet at every MoE layer)."""
        step = self.group.lockstep_step(now)
        merged = StepResult(now, step.duration, 1, 0, [], [], [])
        for res in step.results:
            if res is not None:
                merged.prefill_tokens += res.prefill_tokens
                merged.first_tokens += res.first_tokens
                merged.finished += res.finished
                merged.decoded += res.decoded
        for r in merged.finished:
            self._rank_of.pop(r.rid, None)
        return merged

    def abort(self, r: SchedRequest, now: float) -> bool:
        rank = self._rank_of.pop(r.rid, None)
        return rank is not None and self.group.ranks[rank].scheduler.abort(r, now)


class LockstepEngine(Engine):
    """One engine over an expert-parallel group: one loop, one clock, every rank's requests."""

    def __init__(self, group: DpGroup, time_scale: float, on_rank_events: RankEvents,
                 on_first_token: Callable[[float], None] | None = None,
                 on_finished: Callable[[SchedRequest], None] | None = None) -> None:
        super().__init__(group.ranks[0], time_scale, None, on_first_token, on_finished)
        self.group = group
        self.lockstep = LockstepScheduler(group)
        self.stepper = self.lockstep
        self.on_rank_events = on_rank_events

    def pick_rank(self, asked: int | None) -> int:
        return self.group.pick(asked)

    def _queue(self, req: SchedRequest, rank: int) -> None:
        self.lockstep.submit(req, rank)
        self.group.routed[rank] += 1

    def publish_events(self) -> None:
        for rank, core in enumerate(self.group.ranks):
            events = core.drain_events()
            if events:
                self.on_rank_events(rank, events)


class DpEngine:
    """The ranks of one replica behind the calls its views make of an ``Engine`` (submit, abort, counters, clock)."""

    def __init__(self, cores: Sequence[ReplicaCore], cost: CostModel, settings: DpSettings, time_scale: float,
                 on_rank_events: RankEvents, on_first_token: Callable[[float], None] | None = None,
                 on_finished: Callable[[SchedRequest], None] | None = None) -> None:
        self.group = DpGroup(cores, cost, settings)
        self.lockstep: LockstepEngine | None = None
        if settings.lockstep:
            self.lockstep = LockstepEngine(self.group, time_scale, on_rank_events, on_first_token, on_finished)
            self.engines: list[Engine] = [self.lockstep]
        else:
            self.engines = [Engine(core, time_scale, _bound(on_rank_events, rank), on_first_token, on_finished)
                            for rank, core in enumerate(cores)]

    def _engine(self, rank: int) -> Engine:
        return self.lockstep if self.lockstep is not None else self.engines[rank]

    def submit(self, hashes, prompt_tokens: int, max_tokens: int, session: str | None, stream: bool,
               response_hashes=None, hold: bool = False, rank: int | None = None) -> Handle:
        """Queue a request on the rank it names (``InputError`` naming ``X-data-parallel-rank`` and the range
        when it names none of them) or on the least loaded."""
        rank = self.group.pick(rank)
        if self.lockstep is not None:
            return self.lockstep.submit(hashes, prompt_tokens, max_tokens, session, stream, response_hashes, hold, rank)
        handle = self.engines[rank].submit(hashes, prompt_tokens, max_tokens, session, stream, response_hashes, hold)
        self.group.routed[rank] += 1
        handle.dp_rank = rank
        return handle

    def abort(self, handle: Handle) -> bool:
        return self._engine(handle.dp_rank).abort(handle)

    def publish_events(self) -> None:
        for engine in self.engines:
            engine.publish_events()

    def now(self) -> float:
        """The emulated clock: the latest rank's (independent ranks' clocks each follow the wall clock)."""
        return max(engine.now() for engine in self.engines)

    @property
    def counters(self) -> EngineCounters:
        """The ranks' counters summed (a lockstep step counts once; independent ranks' steps and busy seconds each
        count: rank-seconds)."""
        out = EngineCounters()
        for engine in self.engines:
            c = engine.counters
            out.steps += c.steps
            out.finished += c.finished
            out.aborted += c.aborted
            out.emulated_busy_s += c.emulated_busy_s
        return out

    async def run(self) -> None:
        await asyncio.gather(*(engine.run() for engine in self.engines))

    async def drain(self, timeout: float) -> None:
        await asyncio.gather(*(engine.drain(timeout) for engine in self.engines))

    def rank_stats(self) -> list[dict]:
        """Per rank, what ``/stats`` shows beside the totals: requests given, queues, KV use and hits."""
        out = []
        for row, core in zip(self.group.stats(), self.group.ranks, strict=True):
            m = core.pool.metrics
            row.update({"capacity_blocks": core.pool.capacity, "resident_blocks": core.pool.used,
                        "requests": m.requests, "block_accesses": m.block_accesses, "block_hits": m.block_hits,
                        "tokens_queried": m.tokens_queried, "tokens_hit": m.tokens_hit,
                        "token_hit_ratio": ratio(m.tokens_hit, m.tokens_queried)})
            out.append(row)
        return out


# pool figures that add up over ranks (every other figure of /stats's top level is recomputed from these, or rank 0's)
SUMMED = ("capacity_blocks", "pinned_blocks", "requests", "block_accesses", "block_hits",
          "tokens_queried", "tokens_hit", "recompute_cost_total_s", "recompute_cost_saved_s", "inserted_blocks",
          "evictions", "one_hit_blocks", "one_hit_bytes", "resident_blocks")


def instance_pool_stats(pools: Sequence, top_k: int) -> dict:
    """``/stats``'s pool figures for the whole replica: rank 0's settings (policy, block size, hit mode), the
    counters summed over the ranks, the ratios of the sums, KV use the ranks' mean, sessions by blocks over every
    rank. Holes: the total and the mean; their percentiles and histogram are each rank's (not added)."""
    rows = [pool.stats(top_k=top_k) for pool in pools]
    out = dict(rows[0])
    for key in SUMMED:
        out[key] = sum(row[key] for row in rows)
    counts = pools[0].metrics.counts()
    for pool in pools[1:]:
        counts = counts + pool.metrics.counts()
    out.update(counts.ratios())
    out["prefix_block_hit_ratio"] = ratio(sum(p.metrics.prefix_hit_blocks for p in pools), counts.block_accesses)
    out["usage"] = sum(p.usage() for p in pools) / len(pools)
    holes = sum(row["holes"]["total"] for row in rows)
    out["holes"] = {"total": holes, "mean_per_request": ratio(holes, out["requests"]),
                    "recomputed_blocks": sum(row["holes"]["recomputed_blocks"] for row in rows)}
    sessions: Counter = Counter()
    for pool in pools:
        sessions.update(pool.footprint)
    top = heapq.nlargest(top_k, sessions.items(), key=lambda kv: kv[1])
    out["sessions_resident"] = len(sessions)
    out["top_sessions"] = [{"session": name, "blocks": blocks} for name, blocks in top]
    out.pop("reuse", None)  # a miss-ratio curve per rank does not add up
    return out


def _bound(on_rank_events: RankEvents, rank: int) -> Callable[[list[KvEvent]], None]:
    return lambda events: on_rank_events(rank, events)
