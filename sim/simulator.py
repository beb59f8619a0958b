"""Virtual-time simulator: a trace through R emulated replicas in seconds.

Each replica is the live replica's own core: a ``BlockPool`` with a policy and a
``Scheduler`` whose step times come from the cost model. A virtual clock jumps from
event to event (arrivals and step ends); the router is the same strategy function the
live router calls, fed with the replicas' in-flight counts (counted at decision time),
queued prefill tokens and, for ``cache_aware``, each pool's resident prefix.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain

import numpy as np
from mypy_extensions import mypyc_attr

from loadgen.request_metrics import RequestRecord
from loadgen.trace import HASHES_U64, Trace, response_hashes
from replica.core.build import ReplicaCore, build_core
from replica.core.cache.policies import policy_class
from replica.core.cache.pool import BlockPool
from replica.core.cache.types import Lookup
from replica.core.compiled.pool import CompiledPool, compiles, hashes_fit, hashes_u64, prefix_matches
from replica.core.sched.scheduler import SchedRequest, Scheduler, StepResult
from replica.core.tiers.levels import level_hit_costs
from replica.core.tiers.shared import SharedStore
from replica.core.tiers.stack import TierSettings, TierStack
from router.strategies import ReplicaState, RouteRequest, RoutingSettings, RoutingStep, session_moves, strategy_spec
from shared import compiled_modules
from shared.costmodel import CostModel
from shared.hashing import DEFAULT_BLOCK_SIZE
from shared.histogram import LogHistogram
from shared.index import EventBatch, MemoryIndex
from shared.index.base import DEFAULT_MAX_REPLICAS
from shared.ratios import CacheCounts, ratio
from sim.requests import FinishedRequests
from sim.settings import SIM_REUSE_MODES, SimSettings, core_settings, max_model_len

# SimSettings and what resolves it live in sim/settings.py; importing them from here keeps working
__all__ = ["SIM_REUSE_MODES", "NextUses", "SimSettings", "Simulation", "core_settings", "max_model_len",
           "saturation_warning"]

INF = float("inf")
@dataclass(slots=True)
class _Replica:
    replica_id: str
    core: ReplicaCore  # its pools: ``live_pool`` serves, ``pool`` is the Python pool, settled when read
    sched: Scheduler
    state: ReplicaState
    busy_until: float = INF
    pending: StepResult | None = None  # the step whose end is busy_until
    ttft: LogHistogram = field(default_factory=LogHistogram)
    busy_s: float = 0.0  # emulated seconds spent in scheduler steps
    tiers: TierStack | None = None  # host / SSD below this replica's HBM

    @property
    def pool(self) -> BlockPool:
        """The Python pool, current (``ReplicaCore.pool`` settles the compiled twin into it first)."""
        return self.core.pool

    @property
    def live_pool(self) -> BlockPool | CompiledPool:
        """The pool requests go to: the compiled one where there is one."""
        return self.core.serving

    @property
    def compiled(self) -> CompiledPool | None:
        return self.core.compiled


class NextUses:
    """What the offline oracles are told: for every block access, the position of the next
    access to the same block in the order the cache sees accesses (request order, then the
    block's place in its request), ``inf`` when there is none; 8 bytes per block access.

    Positions, not timestamps: requests that share a timestamp keep their order.
    """

    def __init__(self, trace: Trace) -> None:
        reqs = trace.requests
        lengths = np.fromiter((len(r.hash_ids) for r in reqs), dtype=np.int64, count=len(reqs))
        self.starts = np.zeros(len(reqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.starts[1:])
        flat = np.fromiter(chain.from_iterable(r.hash_ids for r in reqs), dtype=np.uint64, count=int(self.starts[-1]))
        order = np.argsort(flat, kind="stable")  # equal hashes stay in access order
        same = flat[order[1:]] == flat[order[:-1]]
        self.next = np.full(len(flat), np.inf)
        self.next[order[:-1][same]] = order[1:][same]

    def of(self, k: int) -> list[float]:
        """Request ``k``'s next-use positions, one per block."""
        return self.next[self.starts[k]:self.starts[k + 1]].tolist()

    def position(self, k: int) -> float:
        """Where request ``k``'s first block sits in the access order."""
        return float(self.starts[k])


class _Arrivals:
    """Requests in arrival order: trace order, or (causal) each session's turn j+1 released
    by turn j's completion plus their trace gap."""

    def __init__(self, reqs, causal: bool) -> None:
        self.reqs, self.causal, self.i = reqs, causal, 0
        self.heap: list[tuple[float, int]] = []
        self.next_of: dict[int, int] = {}
        if causal:
            by: dict[str, list[int]] = {}
            for k, r in enumerate(reqs):
                by.setdefault(r.session, []).append(k)
            for ks in by.values():
                ks.sort(key=lambda k: (reqs[k].turn, reqs[k].t))  # as loadgen.replay orders a session
                self.heap.append((reqs[ks[0]].t, ks[0]))
                self.next_of.update(zip(ks, ks[1:]))
            heapq.heapify(self.heap)

    def peek(self) -> float:
        if self.causal:
            return self.heap[0][0] if self.heap else INF
        return self.reqs[self.i].t if self.i < len(self.reqs) else INF

    def pop(self) -> tuple[float, int]:
        if self.causal:
            return heapq.heappop(self.heap)
        k = self.i
        self.i += 1
        return self.reqs[k].t, k

    def finished(self, k: int, end: float) -> None:
        nxt = self.next_of.pop(k, None)
        if nxt is not None:
            heapq.heappush(self.heap, (end + max(self.reqs[nxt].t - self.reqs[k].t, 0.0), nxt))


class PoolIndex:
    """The simulator's prefix index: the pools' own KV events applied to a ``MemoryIndex``, as
    the live router's embedded index applies the replicas' feeds. A lookup then costs
    O(prompt) whatever the number of replicas (asking every pool would cost O(replicas x prompt)).
    """

    def __init__(self, replica_ids: list[str], capacity_blocks: int) -> None:
        self.index = MemoryIndex(max_entries=capacity_blocks * len(replica_ids) + 1,
                                 max_replicas=max(len(replica_ids), DEFAULT_MAX_REPLICAS))
        self._seq = dict.fromkeys(replica_ids, 0)

    def sync(self, replica_id: str, pool: BlockPool) -> None:
        """Apply what the pool changed since the last sync (call after anything that allocates)."""
        if pool.events:
            events = pool.drain_events()
            self.index.apply_sync(EventBatch(replica_id, "sim", self._seq[replica_id], events))
            self._seq[replica_id] += len(events)

    def lookup(self, hashes) -> dict[str, int]:
        return self.index.lookup_sync(hashes)


def _build_replica(i: int, s: SimSettings, block_size: int, cost: CostModel, indexed: bool,
                   requests: int, hashes_fit: bool, replica_id: str = "", shared: SharedStore | None = None) -> _Replica:
    core = build_core(core_settings(s, block_size, cost, indexed, requests), cost, hashes_fit=hashes_fit,
                      shared=shared)
    replica_id = replica_id or f"replica-{i}"  # the ids `kvemu up` gives, so session routing hashes the same ring
    return _Replica(replica_id, core, core.scheduler, ReplicaState(replica_id, capacity_blocks=s.capacity_blocks),
                    tiers=core.tiers)


@mypyc_attr(allow_interpreted_subclasses=True)  # compiled by mypyc (shared/compiled_modules.py); tests subclass it
class Simulation:
    def __init__(self, trace: Trace, settings: SimSettings, progress: Callable[[int, int], None] | None = None):
        self.trace = trace
        self.s = settings
        self.cost = CostModel.from_names(settings.model, settings.gpu)
        self.block_size = trace.block_size
        spec = strategy_spec(settings.routing)
        indexed = self._wants_index(settings)
        # the compiled pool keys on 64-bit unsigned hashes (build_core's compilable decides with that;
        # no trace pass for a policy it has not compiled)
        compiled = settings.compiled and compiles(settings.policy)
        lists = [r.hash_ids for r in trace.requests]
        # the cache-only replay reads them as one array; a batching run only asks whether they fit
        flat = hashes_u64(lists) if compiled and settings.cache_only else None
        fits = flat is not None if settings.cache_only else compiled and (trace.meta.get(HASHES_U64) is True
                                                                          or hashes_fit(lists))
        self._flat_hashes = flat
        # Compiled pools ship no events: the index is asked of them directly (one C call a request,
        # ``prefix_matches``), which is what an index fed every pool's events answers, exactly and
        # never behind. Where one pool is not compiled, every pool ships events to a MemoryIndex.
        self.replicas = self._build(settings, indexed and not fits, fits)
        if indexed and fits and any(rep.compiled is None for rep in self.replicas):
            why = next((rep.core.why_python for rep in self.replicas if rep.core.why_python), None)
            self.replicas = self._build(settings, True, True)
            for rep in self.replicas:  # the reason is the first build's: events were never the cause
                rep.core.why_python = why
        kernels = [rep.compiled for rep in self.replicas if rep.compiled is not None]
        self._kernels = kernels if indexed and len(kernels) == len(self.replicas) else None
        self.by_id = {r.replica_id: r for r in self.replicas}
        self.tiered = any(rep.tiers is not None for rep in self.replicas)
        self._tier_pools = [(rep.replica_id, rep.tiers, [lv.held for lv in rep.tiers.levels])
                            for rep in self.replicas if rep.tiers is not None]
        self.responses = response_hashes(trace) if settings.response_kv == "keep" else None
        self.source_trace = trace  # as read: the per-request results name every request of it
        self.trace_index: list[int] | None = None  # the source's index of each request run (None: all, in order)
        self.refused = self._refuse()
        self.states = [rep.state for rep in self.replicas]
        self.index = PoolIndex([r.replica_id for r in self.replicas],
                               max(rep.state.capacity_blocks for rep in self.replicas)) \
            if indexed and self._kernels is None else None
        self._ids = [r.replica_id for r in self.replicas]
        routing = settings.routing_settings or RoutingSettings(  # as kvemu.options.router_flags builds them
            block_size=trace.block_size, level_hit_costs=level_hit_costs(settings.tiers.levels()),
            load_block_size=DEFAULT_BLOCK_SIZE if settings.matching == "radix" else 0)
        self.router = RoutingStep(spec, routing, settings.seed)
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

    def _build(self, s: SimSettings, events: bool, hashes_fit: bool) -> list[_Replica]:
        stores = self._shared_stores(s.tiers, s.replicas)
        return [_build_replica(i, s, self.trace.block_size, self.cost, events, len(self.trace.requests), hashes_fit,
                               shared=stores[i] if stores else None)
                for i in range(s.replicas)]

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
            out += [k for k in maybe if sched.refusal(SchedRequest(
                k, reqs[k].hash_ids, reqs[k].input_tokens, max(reqs[k].output_tokens, 1), reqs[k].t)) is not None]
        if not out:
            return 0
        gone = set(out)
        out = sorted(gone)
        keep = [k for k in range(len(reqs)) if k not in gone]
        self.trace_index = keep
        self.trace = Trace([reqs[k] for k in keep], self.trace.block_size, self.trace.source, self.trace.meta)
        if self.responses is not None:
            self.responses = [self.responses[k] for k in keep]
        if self._flat_hashes is not None:
            self._flat_hashes = hashes_u64([r.hash_ids for r in self.trace.requests])
        return len(out)

    def _wants_index(self, s: SimSettings) -> bool:
        """Whether routing asks which replica holds a prompt: one replica's pool is its own index."""
        return strategy_spec(s.routing).uses_index and s.replicas > 1

    def _refusers(self) -> list[Scheduler]:
        """The schedulers whose refusal rule decides what never runs: every replica's is the same here."""
        return [self.replicas[0].sched]

    def run(self) -> dict:
        future = NextUses(self.trace) if policy_class(self.s.policy).needs_future else None
        if self.s.cache_only:
            return self._run_cache_only(future)
        reqs = self.trace.requests
        busy: list[tuple[float, int, str]] = []  # (step end, tiebreak, replica id)
        arrivals = _Arrivals(reqs, self.s.causal)
        self._arrivals = arrivals
        seq = 0
        idle: list = []  # idle replicas given a request at the current arrival time, not started yet
        t0 = time.perf_counter()
        n = len(reqs)
        for i in range(n + 1):
            t_next = arrivals.peek()
            while busy and busy[0][0] <= t_next:
                end, _, replica_id = heapq.heappop(busy)
                rep = self.by_id[replica_id]
                self._complete_step(rep)  # may release a session's next turn (causal)
                t_next = arrivals.peek()
                seq = self._start_step(rep, end, t_next, busy, seq)
            if i == n or t_next == INF:  # INF: a session waits on a request that can never run
                break
            t, k = arrivals.pop()
            if i == 0:
                self.first_arrival = t
            self.last_arrival = t
            r = reqs[k]
            rep, self._views[k] = self._route(r)
            req = SchedRequest(k, r.hash_ids, r.input_tokens, max(r.output_tokens, 1), t, r.session,
                               future.of(k) if future else None, future.position(k) if future else None)
            if self.responses is not None:
                req.response_hashes = self.responses[k]
            rep.sched.submit(req)  # what could never run was refused before the run (_refuse)
            if rep.busy_until == INF and rep not in idle:
                idle.append(rep)
            if idle and arrivals.peek() > t:  # every request arriving at t is queued: one step takes them all
                for rep in idle:
                    seq = self._start_step(rep, t, arrivals.peek(), busy, seq)
                idle.clear()
            if self.progress and i % 2000 == 0:
                self.progress(i, n)
        if self.progress:
            self.progress(n, n)
        return self._report(time.perf_counter() - t0)

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
                self.index.sync(rep.replica_id, rep.pool)
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

    def _route(self, r) -> tuple[_Replica, RouteRequest]:
        view = RouteRequest(r.session, len(r.hash_ids), r.input_tokens)
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

    def _start_step(self, rep: _Replica, now: float, horizon: float, busy: list, seq: int) -> int:
        if not rep.sched.has_work():
            rep.busy_until = INF
            return seq
        res = rep.sched.step(now, horizon)
        if self.index is not None:
            self.index.sync(rep.replica_id, rep.pool)
        if res.duration <= 0 and not res.finished and not res.first_tokens and not res.decoded:
            rep.busy_until = INF  # nothing could run; the next arrival or completion restarts it
            return seq
        rep.busy_until = now + res.duration
        rep.busy_s += res.duration
        rep.pending = res
        heapq.heappush(busy, (rep.busy_until, seq, rep.replica_id))
        return seq + 1

    def _complete_step(self, rep: _Replica) -> None:
        res = rep.pending
        assert res is not None  # only a started step completes
        rep.pending = None
        views = self._views
        for r in res.first_tokens:  # the cluster's TTFT is the replicas' merged at the end
            rep.ttft.add(r.t_first_token - r.arrival)
            self.queue.add(r.waited)  # admission - arrival, unless preempted before its first token
            self.router.prefilled(rep.state, views[r.rid])
        for r in res.finished:
            self._arrivals.finished(r.rid, r.t_finished)
            self.e2e.add(r.t_finished - r.arrival)
            self._finished(r, rep.replica_id)
            self.last_finish = max(self.last_finish, r.t_finished)
            self.router.done(rep.state, views.pop(r.rid))
            self.served += 1
        rep.state.kv_usage = rep.live_pool.usage()

    def _finished(self, r: SchedRequest, replica_id: str) -> None:
        """``r`` finished on ``replica_id``: its TPOT, and its times kept for the exact figures."""
        if r.output_tokens > 1 and r.t_first_token >= 0:
            self.tpot.add((r.t_finished - r.t_first_token) / (r.output_tokens - 1))
        self.finished_requests.add(r, replica_id)

    def request_records(self) -> list[RequestRecord]:
        """One record per request of the trace as read, in its order (``kvemu sim --requests-out``)."""
        return self.finished_requests.records(self.source_trace, self.trace_index)

    def _engine(self) -> str:
        """``compiled`` where every replica's pools run their compiled twins, ``python`` where none's HBM
        does, else ``mixed`` (``ReplicaCore.engine``)."""
        engines = {rep.core.engine for rep in self.replicas}
        return engines.pop() if len(engines) == 1 else "mixed"

    def _report(self, wall_s: float) -> dict:
        per = []
        timed = None if self.s.cache_only else True  # cache-only has no clock: no latencies to report
        counts = CacheCounts()
        requests = evictions = holes = preemptions = 0
        for rep in self.replicas:
            st = rep.pool.stats()
            m = rep.pool.metrics
            st["replica"] = rep.replica_id
            st["scheduler"] = rep.sched.stats()
            preemptions += rep.sched.preemptions
            st["ttft_p50_s"] = None if timed is None else rep.ttft.quantile(0.5)
            st["ttft_p99_s"] = None if timed is None else rep.ttft.quantile(0.99)
            st["busy_s"] = rep.busy_s
            if rep.tiers is not None:  # LMCache's hits per level, in tokens: where each prompt block came from
                st["hit_tokens_by_level"] = self._hit_tokens(rep.tiers)
            per.append(st)
            counts += m.counts()
            requests, evictions, holes = requests + m.requests, evictions + m.evictions, holes + m.holes_total
        reqs = [p["requests"] for p in per]
        mean_load = sum(reqs) / len(reqs) if reqs else 0
        return {
            **self._setup_report(),
            "requests": requests,
            "served": self.served,
            # vLLM's length rule: prompt plus output over max_model_len (or beyond the pool), never run
            "refused": self.refused,
            "max_model_len": max_model_len(self.s, self.cost, self.block_size),
            "block_accesses": counts.block_accesses,
            **counts.ratios(),
            "holes": {"total": holes, "mean_per_request": ratio(holes, requests)},
            "evictions": evictions,
            **self._tier_report(counts),
            **self._latencies(timed is not None),
            **self._throughput(timed is not None, preemptions),
            # exact means and percentiles from every request (the *_p50_s above are the histograms')
            "latency": self.finished_requests.summary(len(self.source_trace.requests)) if timed else None,
            "load_imbalance": (max(reqs) / mean_load) if mean_load else 0.0,
            "arrival_span_s": self.last_arrival - self.first_arrival,
            "drain_s": max(self.last_finish - self.last_arrival, 0.0),
            "saturated": self._saturated(per),
            "routing_decisions": dict(sorted(self.router.decisions.items())),
            "session_moves": session_moves(self.router),
            "per_replica": per,
            "wall_s": round(wall_s, 3),
        }

    def _setup_report(self) -> dict:
        """What ran: the mode, the settings, the pool's capacity (in its own unit, blocks of
        ``block_size`` tokens, pages under radix, and in tokens and bytes, which mean one memory in
        every mode) and which engines served."""
        return {
            "mode": "cache_only" if self.s.cache_only else "batching",
            "reuse": self.s.reuse_mode if self.s.reuse_mode != "sampled" else f"sampled (SHARDS, rate {self.s.shards_rate:g})",
            "policy": self.s.policy,
            "capacity_blocks": self.s.capacity_blocks,
            "capacity_tokens": self.s.capacity_blocks * self.block_size,
            "capacity_bytes": self.s.capacity_blocks * self.cost.block_bytes(self.block_size),
            "capacity_gib": round(self.cost.blocks_to_gib(self.s.capacity_blocks, self.block_size), 3),
            "replicas": self.s.replicas,
            "routing": self.s.routing,
            "hit_mode": self.s.hit_mode,
            "matching": self.s.matching,
            "response_kv": self.s.response_kv,
            "prefix_caching": self.s.prefix_caching,
            "max_running": self.s.max_running,
            "scheduler": None if self.s.cache_only else self.s.scheduler,
            "decode_kv": None if self.s.cache_only else self.s.decode_kv,
            # the pool that served: compiled (replica.core.compiled.pool, the same results) or python, and
            # why not compiled where it was asked for (None: it ran, or --python-core asked for Python)
            "engine": self._engine(),
            "engine_reason": next((why for rep in self.replicas for why in (rep.core.why_python,
                                                                             rep.core.why_python_levels) if why), None),
            # the scheduler step and this loop: compiled by mypyc from their source, or that source
            # (shared.compiled_modules: the same results)
            "step_engine": compiled_modules.status(),
            "step_engine_reason": compiled_modules.reason() or None,
            "block_size": self.block_size,
            "model": self.cost.model.name,
            "kv_cache_dtype": self.cost.model.kv_cache_dtype,
            "gpu": self.cost.gpu.name,
        }

    def _hit_tokens(self, tiers: TierStack) -> dict[str, int]:
        """Tokens of admitted prompts' blocks by where they came from: HBM, each lower level by name, or
        recomputed (blocks of ``block_size`` tokens; a prompt's partial tail is never reused)."""
        c, bs = tiers.counters, self.block_size
        out = {"hbm": c.hits[0] * bs}
        out.update({name: c.hits[k] * bs for k, name in enumerate(tiers.names, 1)})
        out["recomputed"] = (c.accessed_blocks - sum(c.hits)) * bs
        return out

    def _tier_report(self, counts: CacheCounts) -> dict:
        """Per-level hit ratios over block accesses (without tiers, HBM's is the block hit ratio),
        each level under its name (``host_block_hit_ratio``, ...)."""
        levels = self.s.tiers.levels()
        stacks = [rep.tiers for rep in self.replicas if rep.tiers is not None]
        if not stacks:
            out: dict = {"hbm_block_hit_ratio": ratio(counts.block_hits, counts.block_accesses)}
            out.update({f"{lv.kind}_block_hit_ratio": 0.0 for lv in levels})
            out["all_levels_block_hit_ratio"] = out["hbm_block_hit_ratio"]
            return {**out, "fetched_blocks": 0, "recomputed_blocks": counts.block_accesses - counts.block_hits}
        c = [t.counters for t in stacks]
        n = sum(x.accessed_blocks for x in c)
        hits = [sum(x.hits[k] for x in c) for k in range(len(levels) + 1)]  # hits[0]: HBM
        moved: dict[str, int] = {}
        for t in stacks:
            for link, b in t.stats()["bytes_moved"].items():
                moved[link] = moved.get(link, 0) + b
        s = stacks[0].settings
        out = {"hbm_block_hit_ratio": ratio(hits[0], n)}
        out.update({f"{lv.kind}_block_hit_ratio": ratio(hits[k], n) for k, lv in enumerate(levels, 1)})
        out["all_levels_block_hit_ratio"] = ratio(sum(hits), n)  # reused from any level: what was not recomputed
        tiers: dict = {"mode": s.mode, "fetch": s.fetch}
        tiers.update({f"{lv.kind}_blocks": lv.blocks for lv in levels})
        tiers.update({f"{lv.kind}_policy": lv.policy for lv in levels})
        if s.shared is not None:  # the store's own eviction, not a block policy
            tiers["shared_policy"] = s.shared.eviction
        if self.stores:  # the shared level's stores, as many as its scope makes
            tiers["shared"] = [store.stats() for store in self.stores]
        tiers.update({"host_link_gbps": s.host_link_gbps, "bytes_moved": moved,
                      "demoted_blocks": sum(x.demoted for x in c), "dropped_blocks": sum(x.dropped for x in c),
                      # held by a lower level but recomputed: --fetch auto found the restore slower
                      "recomputed_from_tier_blocks": sum(x.recomputed for x in c)})
        return {**out, "fetched_blocks": sum(hits[1:]), "recomputed_blocks": n - sum(hits), "tiers": tiers}

    def _latencies(self, timed: bool) -> dict[str, float | None]:
        ttft = LogHistogram()
        for rep in self.replicas:  # the same counts, minimum and maximum as one cluster-wide histogram
            ttft.merge(rep.ttft)
        hists = {"ttft": ttft, "queue": self.queue, "e2e": self.e2e, "tpot": self.tpot}
        out: dict[str, float | None] = {}
        for name, q in (("ttft_p50_s", 0.5), ("ttft_p95_s", 0.95), ("ttft_p99_s", 0.99), ("queue_p99_s", 0.99),
                        ("e2e_p50_s", 0.5), ("e2e_p99_s", 0.99), ("tpot_p50_s", 0.5), ("tpot_p99_s", 0.99)):
            out[name] = hists[name.split("_")[0]].quantile(q) if timed else None
        return out

    def _throughput(self, timed: bool, preemptions: int) -> dict[str, float | int | None]:
        """Requests finished per second from the first arrival to the last finish; the fraction of
        HBM blocks held by running requests, averaged over that span (idle time counts as empty);
        requests preempted (reorder). ``hbm_utilization_queued``: the same over the steps that began
        with requests waiting (the memory FlashGen's reordering fills: FCFS leaves it idle behind a
        head that does not fit); ``hbm_utilization_head_blocked``: over the steps whose head waited for
        memory (a head may also wait for a step's token budget or max_running); ``mean_batch_size``:
        requests running per step (prefilling or
        decoding), over every step. Cache-only runs have no clock: None."""
        span = self.last_finish - self.first_arrival
        if not timed:
            return {"preemptions": None, "throughput_rps": None, "hbm_utilization": None,
                    "hbm_utilization_queued": None, "hbm_utilization_head_blocked": None, "mean_batch_size": None}
        scheds = [rep.sched for rep in self.replicas]
        held = sum(s.pinned_block_s for s in scheds)
        queued = sum(s.queued_s for s in scheds)
        blocked = sum(s.blocked_s for s in scheds)
        return {"preemptions": preemptions, "throughput_rps": ratio(self.served, span),
                "hbm_utilization": ratio(held, span * self.s.capacity_blocks * len(self.replicas)),
                "hbm_utilization_queued": ratio(sum(s.queued_block_s for s in scheds), queued * self.s.capacity_blocks)
                if queued else None,  # None: no request ever waited
                # the same over the steps whose queue head waited for memory (not for a step's room)
                "hbm_utilization_head_blocked": ratio(sum(s.blocked_block_s for s in scheds),
                                                      blocked * self.s.capacity_blocks) if blocked else None,
                "mean_batch_size": ratio(sum(s.batch_steps for s in scheds), sum(s.steps for s in scheds))}

    def _saturated(self, per: list[dict]) -> bool:
        """A replica's queue grew without bound: busy nearly all the time requests arrived, and
        still working through a backlog long after the last one (a tenth of the trace or more)."""
        span = self.last_arrival - self.first_arrival
        drain = self.last_finish - self.last_arrival
        if span <= 0:
            return False
        return drain > max(0.1 * span, 60.0) and max(p["busy_s"] for p in per) > 0.9 * span


def saturation_warning(runs: list[dict]) -> str | None:
    """One line for the runs whose replica queue grew without bound (their TTFT is mostly
    waiting), naming the worst; None when every queue kept up."""
    bad = [r for r in runs if r.get("saturated")]
    if not bad:
        return None
    w = max(bad, key=lambda r: r["drain_s"])
    which = f"{w['policy']} @ {w['capacity_blocks']:,} blocks"
    head = f"warning: {which}" if len(bad) == 1 else f"warning: {len(bad)} of {len(runs)} runs (worst: {which})"
    more = f"--replicas (now {w['replicas']})"
    if w.get("pd"):  # a P/D run: the pool whose queue grew is the one to widen
        topo = w["pd"]["topology"]
        more = f"--prefill-replicas (now {topo['prefill']}) or --decode-replicas (now {topo['decode']})"
    return (f"{head}: the replica queue grew without bound (the last request finished {_duration(w['drain_s'])}"
            f" after the last arrival, over a {_duration(w['arrival_span_s'])} trace), so TTFT is mostly queueing;"
            f" raise --max-running (now {w['max_running']}) or {more}, or lower the load")


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"
