"""Virtual-time simulator: a trace through R emulated replicas in seconds.

Each replica is the live replica's own core: a ``BlockPool`` with a policy and a
``Scheduler`` whose step times come from the cost model. A virtual clock jumps from
event to event: one loop (``Simulation.run``) takes the next arrival or the next event of one heap
of typed events, ``(time, seq, kind, who)``: a replica's step ended (``STEP_END``, ``who`` its
position) or, in a P/D cluster, a transfer's KV may have landed (``KV_DUE``, ``who`` the request);
ties go to events before arrivals, then to the order they were queued. The router is the same
strategy function the live router calls, fed with the replicas' in-flight counts (counted at
decision time), queued prefill tokens and, for ``cache_aware``, each pool's resident prefix.

A P/D cluster (``SimSettings.pd``) runs through the same loop: its component (sim/pd_flow.py, ``PdFlow``)
says what each instance is, splits an arrival into a remote prefill or a local one, starts a
transfer when a prefill leg ends and settles it when its event comes; the report is sim/report.py's.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from mypy_extensions import mypyc_attr

from loadgen.arrivals import Arrivals
from loadgen.request_metrics import RequestRecord
from loadgen.trace import HASHES_U64, Trace, has_dependencies, response_hashes
from replica.core.build import ReplicaCore, build_core
from replica.core.cache.group_usage import GroupSampler, grouped_pool
from replica.core.cache.grouped import GroupedPool
from replica.core.cache.policies import policy_class
from replica.core.cache.pool import BlockPool
from replica.core.cache.types import Lookup
from replica.core.compiled.pool import CompiledPool, compiles, hashes_fit, hashes_u64, prefix_matches
from replica.core.sched.scheduler import SchedRequest, Scheduler, StepResult
from replica.core.tiers.levels import level_hit_costs
from replica.core.tiers.shared import SharedStore
from replica.core.tiers.stack import TierSettings, TierStack
from router.strategies import ReplicaState, RouteRequest, RoutingSettings, RoutingStep, strategy_spec
from shared.costmodel import CostModel
from shared.hashing import DEFAULT_BLOCK_SIZE
from shared.histogram import LogHistogram
from sim.dp import DpFlow
from sim.next_uses import NextUses
from sim.pd_flow import PdFlow
from sim.pool_index import PoolIndex
from sim.report import run_report, saturation_warning
from sim.requests import FinishedRequests
from sim.settings import SIM_REUSE_MODES, SimSettings, core_settings, max_model_len

# SimSettings and what resolves it live in sim/settings.py, the report in sim/report.py; importing them from
# here keeps working
__all__ = ["SIM_REUSE_MODES", "NextUses", "SimSettings", "Simulation", "core_settings", "max_model_len",
           "saturation_warning"]

INF = float("inf")
# the kinds of the loop's events
STEP_END: Final = 0  # a replica's step ended; who: its position in Simulation.replicas
KV_DUE: Final = 1  # P/D: a transfer's KV may have landed (PdFlow.kv_due); who: the request's id


@dataclass(slots=True)
class Replica:
    replica_id: str
    core: ReplicaCore  # its pools: ``live_pool`` serves, ``pool`` is the Python pool, settled when read
    sched: Scheduler
    state: ReplicaState
    busy_until: float = INF
    pending: StepResult | None = None  # the step whose end is busy_until
    ttft: LogHistogram = field(default_factory=LogHistogram)
    busy_s: float = 0.0  # emulated seconds spent in scheduler steps
    tiers: TierStack | None = None  # host / SSD below this replica's HBM
    role: str = "both"  # P/D: "prefill" or "decode" (replica/core/disagg.py ROLES); "both": colocated
    pos: int = -1  # its place in Simulation.replicas (a STEP_END event's who)
    groups: GroupSampler | None = None  # several KV cache groups: each group's blocks, step by step

    @property
    def pool(self) -> BlockPool:
        """The Python pool, current (``ReplicaCore.pool`` settles the compiled twin into it first)."""
        return self.core.pool

    @property
    def live_pool(self) -> BlockPool | CompiledPool | GroupedPool:
        """The pool requests go to: the compiled one where there is one."""
        return self.core.serving

    @property
    def compiled(self) -> CompiledPool | None:
        return self.core.compiled


def build_replica(i: int, s: SimSettings, block_size: int, cost: CostModel, indexed: bool,
                   requests: int, hashes_fit: bool, replica_id: str = "", shared: SharedStore | None = None) -> Replica:
    core = build_core(core_settings(s, block_size, cost, indexed, requests), cost, hashes_fit=hashes_fit,
                      shared=shared)
    replica_id = replica_id or f"replica-{i}"  # the ids `kvemu up` gives, so session routing hashes the same ring
    grouped = grouped_pool(core.scheduler.pool)
    return Replica(replica_id, core, core.scheduler, ReplicaState(replica_id, capacity_blocks=s.capacity_blocks),
                    tiers=core.tiers, groups=GroupSampler(grouped) if grouped is not None else None)


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled by mypyc (shared/compiled_modules.py); tests subclass it
class Simulation:
    def __init__(self, trace: Trace, settings: SimSettings, progress: Callable[[int, int], None] | None = None):
        self.trace = trace
        self.s = settings
        self.cost = CostModel.from_names(settings.model, settings.gpu)
        self.block_size = trace.block_size
        # a P/D cluster's component: its instances' roles and shapes now, its pools and network once they are built
        self.pd: PdFlow | None = PdFlow(settings) if settings.pd is not None else None
        # instances of DP ranks: their component (sim/dp.py) says which ranks to build, routes to a rank as the live
        # router does, and steps the ranks in lockstep under expert parallelism
        self.dp: DpFlow | None = DpFlow(settings, self.cost) if settings.data_parallel_size > 1 else None
        spec = strategy_spec(settings.routing)
        indexed = self._wants_index(settings)
        self.replicas, self._flat_hashes = self._build_replicas(settings, indexed)
        if self.dp is not None:
            self.dp.attach(self)
        kernels = [rep.compiled for rep in self.replicas if rep.compiled is not None]
        self._kernels = kernels if indexed and len(kernels) == len(self.replicas) else None
        self.by_id = {r.replica_id: r for r in self.replicas}
        self.tiered = any(rep.tiers is not None for rep in self.replicas)
        self._tier_pools = [(rep.replica_id, rep.tiers, [lv.held for lv in rep.tiers.levels])
                            for rep in self.replicas if rep.tiers is not None]
        self.responses = response_hashes(trace) if settings.knobs.response_kv == "keep" else None
        self.source_trace = trace  # as read: the per-request results name every request of it
        self.trace_index: list[int] | None = None  # the source's index of each request run (None: all, in order)
        self.refused = self._refuse()
        self.states = [rep.state for rep in self.replicas]
        self.index = PoolIndex([r.replica_id for r in self.replicas],
                               max(rep.state.capacity_blocks for rep in self.replicas)) \
            if indexed and self._kernels is None else None
        self._ids = [r.replica_id for r in self.replicas]
        routing = settings.routing_settings or RoutingSettings(  # as kvemu.options.router_flags builds them
            block_size=trace.block_size, level_hit_costs=level_hit_costs(settings.knobs.tiers.levels()),
            load_block_size=DEFAULT_BLOCK_SIZE if settings.knobs.matching == "radix" else 0)
        self.router = RoutingStep(spec, routing, settings.knobs.seed)
        # each request's routing view from its routing to its end: the router's load counts take it back at
        # its first token (its prefill) and its end (in flight), as the live router does (router/strategies/step.py)
        self._views: dict[int, RouteRequest] = {}
        self.progress = progress
        self.e2e = LogHistogram()
        self.tpot = LogHistogram()  # time per output token after the first, per request (vLLM's TPOT, the ITL's mean)
        self.queue = LogHistogram()
        self.served = 0
        self.first_arrival = self.last_arrival = self.last_finish = 0.0
        self.finished_requests = FinishedRequests()  # each finished request's times: exact figures, --requests-out
        self._events: list[tuple[float, int, int, int]] = []  # the loop's heap: (time, seq, kind, who)
        self._seq = 0  # events queued so far: equal times go in the order they were queued
        self._kicked: list[Replica] = []  # idle replicas given work at the current time, started once it is over
        # P/D: when the events that may give another instance work are due (a prefill step's end: its legs reserve
        # on their decode instances; a transfer's: the KV lands, the prefill instance's blocks go back); a heap
        self._pd_due: list[float] = []
        self._arrivals = Arrivals([])
        if self.pd is not None:
            self.pd.attach(self)

    def _build_replicas(self, settings: SimSettings, indexed: bool) -> tuple[list[Replica], Any]:
        """The instances' cores, compiled where they can be, and the trace's hashes as one array where the
        cache-only replay reads them so (else None)."""
        trace = self.trace
        # the compiled pool keys on 64-bit unsigned hashes (build_core's compilable decides with that;
        # no trace pass for a policy it has not compiled)
        compiled = settings.compiled and compiles(settings.knobs.policy)
        lists = [r.hash_ids for r in trace.requests]
        # the cache-only replay reads them as one array; a batching run only asks whether they fit
        flat = hashes_u64(lists) if compiled and settings.cache_only else None
        fits = flat is not None if settings.cache_only else compiled and (trace.meta.get(HASHES_U64) is True
                                                                          or hashes_fit(lists))
        # Compiled pools ship no events: the index is asked of them directly (one C call a request,
        # ``prefix_matches``), which is what an index fed every pool's events answers, exactly and
        # never behind. Where one pool is not compiled, every pool ships events to a MemoryIndex.
        replicas = self._build(settings, indexed and not fits, fits)
        if indexed and fits and any(rep.compiled is None for rep in replicas):
            why = next((rep.core.why_python for rep in replicas if rep.core.why_python), None)
            replicas = self._build(settings, True, True)
            for rep in replicas:  # the reason is the first build's: events were never the cause
                rep.core.why_python = why
        for pos, rep in enumerate(replicas):
            rep.pos = pos
        return replicas, flat

    def _build(self, s: SimSettings, events: bool, hashes_fit: bool) -> list[Replica]:
        """The replicas: ``s.replicas`` alike (each ``data_parallel_size`` ranks), or a P/D cluster's instances, each
        with its pool's shape."""
        pd = self.pd
        if pd is None:
            stores = self._shared_stores(s.knobs.tiers, s.replicas)
            members = self.dp.members(s.replicas) if self.dp is not None else [(i, "") for i in range(s.replicas)]
            return [build_replica(i, s, self.trace.block_size, self.cost, events, len(self.trace.requests), hashes_fit,
                                  replica_id, stores[i] if stores else None)
                    for i, replica_id in members]
        stores = self._shared_stores(s.knobs.tiers, len(pd.roles))
        out = []
        for i, (replica_id, role) in enumerate(pd.roles.items()):
            ps, cost = pd.instance_settings(replica_id)
            rep = build_replica(i, ps, self.trace.block_size, cost, events, len(self.trace.requests), hashes_fit,
                                replica_id, stores[i] if stores else None)
            rep.role = role
            out.append(rep)
        return out

    def _shared_stores(self, tiers: TierSettings, replicas: int) -> list[SharedStore]:
        """Each replica's shared store, in replica order: one for the cluster, or one per ``scope`` replicas
        (none without a shared level); kept in ``self.stores``."""
        shared = tiers.shared
        if shared is None:
            self.stores: list[SharedStore] = []
            return []
        self.stores = [SharedStore(shared, emit_events=False) for _ in shared.groups(replicas)]
        return [self.stores[shared.group_of(i, replicas)] for i in range(replicas)]

    def _refuse(self) -> int:
        """Refuse, ahead of the run, every request that could never run on these replicas
        (``Scheduler.refusal``: vLLM's length rule, then a prompt or output the pool could never
        hold), as a live replica answers them 400 at once; returns how many. They leave the trace the
        run sees, so no pool, policy, oracle or index sees them; kept responses stay those of the whole
        trace. The rule depends only on the request and the settings, so this is what refusing at
        arrival would count (such a request would hold nothing and take no time)."""
        reqs = self.trace.requests
        out: list[int] = []
        for sched in self._refusers():  # a request any pool it may need refuses is refused
            limit, cap = sched.settings.max_model_len, sched.pool.capacity
            # the cheap test first: within the limit (never above the pool's size) and a prompt the pool holds
            maybe = [k for k, r in enumerate(reqs)
                     if not limit or r.input_tokens + max(r.output_tokens, 1) > limit or len(r.hash_ids) > cap]
            if hasattr(sched.pool, "admission_need"):  # KV cache groups count more than a block a block: ask each
                maybe = list(range(len(reqs)))
            out += [k for k in maybe if sched.refusal(SchedRequest(
                k, reqs[k].hash_ids, reqs[k].input_tokens, max(reqs[k].output_tokens, 1), reqs[k].t)) is not None]
        refused = set(out)
        lost = self._waiting_on(refused)
        self.dependency_failed = len(lost)
        if not refused:
            return 0
        gone = refused | lost
        keep = [k for k in range(len(reqs)) if k not in gone]
        self.trace_index = keep
        self.trace = Trace([reqs[k] for k in keep], self.trace.block_size, self.trace.source, self.trace.meta)
        if self.responses is not None:
            self.responses = [self.responses[k] for k in keep]
        if self._flat_hashes is not None:
            self._flat_hashes = hashes_u64([r.hash_ids for r in self.trace.requests])
        return len(refused)

    def _waiting_on(self, refused: set[int]) -> set[int]:
        """Under dependent arrivals, the requests that wait (``after``, at any depth) for a refused one: they never
        arrive and leave the run with it, counted as failed (``Arrivals.failed``), as a live replay counts those of
        a request that failed. Cache-only runs have no clock to wait on: trace order, as recorded."""
        reqs = self.trace.requests
        if not refused or self.s.cache_only or self.s.arrivals != "dependent" or not has_dependencies(reqs):
            return set()
        rule = Arrivals(reqs)
        return {d for k in sorted(refused) for d in rule.failed(k, reqs[k].t)} - refused

    def _wants_index(self, s: SimSettings) -> bool:
        """Whether routing asks which replica holds a prompt: one replica's pool is its own index. P/D's decider
        asks what the decode instance holds, whatever the strategy; a DP instance's ranks, which rank holds it."""
        return s.pd is not None or (strategy_spec(s.routing).uses_index and s.replicas * s.data_parallel_size > 1)

    def _refusers(self) -> list[Scheduler]:
        """The schedulers whose refusal rule decides what never runs: one of each role (every colocated
        replica's is the same; a P/D cluster's pools may differ)."""
        firsts: dict[str, Scheduler] = {}
        for rep in self.replicas:
            firsts.setdefault(rep.role, rep.sched)
        return list(firsts.values())

    def run(self) -> dict:
        future = NextUses(self.trace) if policy_class(self.s.knobs.policy).needs_future else None
        if self.s.cache_only:
            return self._run_cache_only(future)
        t0 = time.perf_counter()
        self._run_events(future)
        if self.progress:
            n = len(self.trace.requests)
            self.progress(n, n)
        return self._report(time.perf_counter() - t0)

    def _run_events(self, future: NextUses | None) -> None:
        """The one loop: the next event (events first at equal times) or the next arrival, then the replicas
        kicked at this time, once nothing else happens at it (every request arriving at a time is queued
        before a step takes them)."""
        reqs = self.trace.requests
        arrivals = self._arrivals = Arrivals(reqs, self.s.arrivals == "dependent", self.s.causal)
        events, kicked, pd = self._events, self._kicked, self.pd
        n, seen = len(reqs), 0
        while True:
            t_arr = arrivals.peek()
            if events and events[0][0] <= t_arr:
                now, _, kind, who = heapq.heappop(events)
                if kind == STEP_END:
                    self._step_ended(self.replicas[who], now)  # may release a session's next turn (causal)
                else:
                    assert pd is not None  # only P/D queues KV_DUE
                    pd.kv_due(who, now)
            elif t_arr == INF:  # nothing left; INF too where a session waits on a request that can never run
                break
            else:
                now, k = arrivals.pop()
                if seen == 0:
                    self.first_arrival = now
                self.last_arrival = now
                self._arrive(k, now, future)
                seen += 1
                if self.progress and seen % 2000 == 0:
                    self.progress(seen, n)
            if kicked and min(arrivals.peek(), events[0][0] if events else INF) > now:
                for rep in kicked:
                    if rep.busy_until == INF:  # (a DP group's lockstep step may have started it already)
                        self._start_step(rep, now, self._horizon(now))
                kicked.clear()

    def _schedule(self, at: float, kind: int, who: int) -> None:
        """Queue an event of ``kind`` (``STEP_END``, ``KV_DUE``) at ``at``."""
        self._seq += 1
        heapq.heappush(self._events, (at, self._seq, kind, who))

    def schedule_kv(self, at: float, rid: int) -> None:
        """P/D: request ``rid``'s transfer is projected to land at ``at`` (``PdFlow.kv_due`` then)."""
        self._schedule(at, KV_DUE, rid)
        heapq.heappush(self._pd_due, at)

    def kick(self, rep: Replica) -> None:
        """``rep`` was given work: if idle, it starts a step once nothing else happens at this time (a replica
        whose step ends starts its next at once: it is not idle)."""
        if rep.busy_until == INF and rep not in self._kicked:
            self._kicked.append(rep)

    def _horizon(self, now: float) -> float:
        """How far a decode run started at ``now`` may fast-forward: to the next arrival or, under P/D, to the
        next prefill step's or transfer's end, whichever comes first: those may give it work. Decode and
        colocated replicas' step ends give no other replica work (a session's next turn released by one, under
        --causal, waits for a run's end, as it would behind a step)."""
        horizon = self._arrivals.peek()
        due = self._pd_due
        while due and due[0] < now:
            heapq.heappop(due)
        return due[0] if due and due[0] < horizon else horizon

    def _arrive(self, k: int, t: float, future: NextUses | None) -> None:
        """Request ``k`` arrives at ``t``: routed and queued (under P/D, split by ``PdFlow.arrive``)."""
        r = self.trace.requests[k]
        req = SchedRequest(k, r.hash_ids, r.input_tokens, max(r.output_tokens, 1), t, r.session,
                           future.of(k) if future else None, future.position(k) if future else None)
        if self.responses is not None:
            req.response_hashes = self.responses[k]
        if self.pd is not None:
            self._views[k] = self.pd.arrive(r, req, t, self._overlap(r))
            return
        rep, self._views[k] = self._route(r)
        if rep.core.group_keys is not None:  # several KV cache groups: each block's key in each, for the index
            rep.core.group_keys.teach(req.hashes, req.response_hashes)
        rep.sched.submit(req)  # what could never run was refused before the run (_refuse)
        self.kick(rep)

    def _run_cache_only(self, future: NextUses | None) -> dict:
        t0 = time.perf_counter()
        reqs = self.trace.requests
        n = len(reqs)
        if reqs:  # no clock, but the trace's own span (what a real-time factor divides)
            times = [r.t for r in reqs]
            self.first_arrival, self.last_arrival = min(times), max(times)
        start = self._run_compiled(future)
        for k in range(start, n):
            r = reqs[k]
            rep, view = self._route(r)
            plan = rep.tiers.plan(r.hash_ids, r.t) if rep.tiers is not None else None
            alloc = rep.live_pool.serve(Lookup(r.hash_ids, r.session, r.t, r.input_tokens,
                                               next_use=future.of(k) if future else None,
                                               position=future.position(k) if future else None))
            if plan is not None and rep.tiers is not None:  # no clock here: transfers only count bytes
                rep.tiers.complete(plan, alloc.hashes, alloc.hit_idx, alloc.new_idx, r.t)
            stored = rep.live_pool.store(self.responses[k], r.session, r.t) if self.responses is not None else []
            if rep.tiers is not None:
                rep.tiers.produced(stored, r.t)
                rep.tiers.released(alloc.hashes, stored, r.t)
            if self.index is not None:
                self.index.sync(rep.replica_id, rep.pool, rep.core.group_keys)
            self.router.done(rep.state, view)
            self.served += 1
            if self.progress and k % 2000 == 0:
                self.progress(k, n)
        if self.progress:
            self.progress(n, n)
        return self._report(time.perf_counter() - t0)

    def _run_compiled(self, future: NextUses | None) -> int:
        """Serve the trace through the compiled kernel where it gives the same pool; returns how
        many requests it served (the Python loop serves the rest)."""
        rep = self.replicas[0]
        if len(self.replicas) > 1 or rep.compiled is None or rep.tiers is not None:
            return 0
        progress = self.progress
        done = rep.compiled.serve_requests(self.trace.requests,
                                           (lambda k: progress(k, len(self.trace.requests))) if progress else None,
                                           future.next if future is not None else None, self._flat_hashes,
                                           self.responses)
        self.router.count_only(done)
        self.served += done
        return done

    def _route(self, r) -> tuple[Replica, RouteRequest]:
        view = RouteRequest(r.session, len(r.hash_ids), r.input_tokens)
        if self.dp is not None:  # an instance, then its rank, as the live router picks them
            return self.dp.route(r, view, self._overlap(r)), view
        if len(self.replicas) == 1:  # nothing to choose: no lookup, no strategy (a cache study's hot path)
            self.router.only(self.states[0], view)
            return self.replicas[0], view
        _, pos = self.router.route(self.states, view, self._overlap(r))
        return self.replicas[pos], view

    def _overlap(self, r) -> dict[str, int]:
        """Per replica, the blocks of ``r``'s prompt it holds as routing sees them (HBM's prefix, then
        ``<id>#k`` for a lower level's run), where the strategy uses the index; else nothing."""
        overlap: dict[str, int] = {}
        # several replicas: a strategy that uses the index has one (Simulation.__init__)
        if self.index is not None:  # exact and never behind: synced after every allocation
            overlap = self.index.lookup(r.hash_ids)
        elif self._kernels is not None:
            overlap = {rid: n for rid, n in zip(self._ids, prefix_matches(self._kernels, r.hash_ids)) if n}
        if self.router.uses_index and self.tiered:
            hashes, n, get = r.hash_ids, len(r.hash_ids), overlap.get
            for replica_id, tiers, level_pools in self._tier_pools:
                start = get(replica_id, 0)
                if start >= n:
                    continue
                h = hashes[start]
                for held in level_pools:  # most replicas hold nothing after their HBM prefix: no call then
                    if h in held:
                        overlap.update(tiers.lower_overlap(replica_id, hashes, start))
                        break
        return overlap

    def _start_step(self, rep: Replica, now: float, horizon: float) -> None:
        if self.dp is not None and self.dp.lockstep:  # its group's step, over every rank
            self.dp.start_step(rep, now)
            return
        if not rep.sched.has_work():
            rep.busy_until = INF
            return
        res = rep.sched.step(now, horizon)
        self.sync(rep)
        if rep.groups is not None:
            rep.groups.sample(rep.sched.running, res.duration)
        if res.duration <= 0 and not res.finished and not res.first_tokens and not res.decoded:
            rep.busy_until = INF  # nothing could run; the next arrival or completion restarts it
            return
        self.step_started(rep, res, now)

    def step_started(self, rep: Replica, res: StepResult, now: float) -> None:
        """``rep`` runs ``res`` from ``now``: busy until its end, which the loop takes as a ``STEP_END``."""
        rep.busy_until = now + res.duration
        rep.busy_s += res.duration
        rep.pending = res
        self._schedule(rep.busy_until, STEP_END, rep.pos)
        if rep.role == "prefill":
            heapq.heappush(self._pd_due, rep.busy_until)

    def sync(self, rep: Replica) -> None:
        """The index learns what ``rep``'s pool changed (call after anything that allocates)."""
        if self.index is not None:
            self.index.sync(rep.replica_id, rep.pool, rep.core.group_keys)

    def _step_ended(self, rep: Replica, now: float) -> None:
        self._complete_step(rep, now)
        self._start_step(rep, now, self._horizon(now))  # its next step, at once

    def _complete_step(self, rep: Replica, now: float) -> None:
        res = rep.pending
        assert res is not None  # only a started step completes
        rep.pending = None
        views, pd = self._views, self.pd
        for r in res.first_tokens:  # the cluster's TTFT is the replicas' merged at the end
            rep.ttft.add(r.t_first_token - r.arrival)  # a prefill instance's own: its one token
            if pd is None:
                self.queue.add(r.waited)  # admission - arrival, unless preempted before its first token
                self.router.prefilled(rep.state, views[r.rid])
            else:
                pd.first_token(rep, r)
        for r in res.finished:
            if pd is not None and pd.leg_done(rep, r, now):
                continue  # a prefill leg: its KV crosses to the decode instance
            self._arrivals.finished(r.rid, r.t_finished)
            self.e2e.add(r.t_finished - r.arrival)
            self._finished(r, rep.replica_id)
            self.last_finish = max(self.last_finish, r.t_finished)
            self.router.done(rep.state, views.pop(r.rid))
            self.served += 1
        if pd is not None:  # (the pools' queues are their schedulers' own: P/D's live path learns no first token)
            rep.state.queued_tokens = rep.sched.queued_prefill_tokens
        rep.state.kv_usage = rep.live_pool.usage() if self.dp is None else self.dp.kv_usage(rep)

    def _finished(self, r: SchedRequest, replica_id: str) -> None:
        """``r`` finished on ``replica_id``: its TPOT, and its times kept for the exact figures."""
        if r.output_tokens > 1 and r.t_first_token >= 0:
            self.tpot.add((r.t_finished - r.t_first_token) / (r.output_tokens - 1))
        self.finished_requests.add(r, replica_id)

    def request_records(self) -> list[RequestRecord]:
        """One record per request of the trace as read, in its order (``kvemu sim --requests-out``)."""
        return self.finished_requests.records(self.source_trace, self.trace_index)

    def _report(self, wall_s: float) -> dict:
        return run_report(self, wall_s)
