"""Virtual-time simulator: a trace through R emulated replicas in seconds.

Each replica is the live replica's own core: a ``BlockPool`` with a policy and a
``Scheduler`` whose step times come from the cost model. A virtual clock jumps from
event to event (arrivals and step ends); the router is the same strategy function the
live router calls, fed with the replicas' in-flight counts (counted at decision time),
queued prefill tokens and, for ``cache_aware``, each pool's resident prefix.
"""

from __future__ import annotations

import heapq
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

from loadgen.trace import Trace
from replica.core.build import CoreSettings, build_core
from replica.core.policies import policy_class
from replica.core.pool import BlockPool
from replica.core.scheduler import SchedRequest, Scheduler
from router.strategies import ReplicaState, RouteRequest, RouterMemory, RoutingSettings, get_strategy
from shared.costmodel import CostModel
from shared.errors import InputError
from shared.histogram import LogHistogram

INF = float("inf")


@dataclass(frozen=True, slots=True)
class SimSettings:
    capacity_blocks: int
    policy: str = "lru"
    replicas: int = 1
    routing: str = "cache_aware"
    hit_mode: str = "holes"
    seed: int = 0
    model: str = "qwen3-coder-30b-a3b"
    gpu: str = "h200"
    token_budget: int = 8192
    max_running: int = 256
    reuse_distances: bool = True
    policy_params: tuple[tuple[str, object], ...] = ()
    routing_settings: RoutingSettings | None = None
    # Session causality, as `kvemu replay` sends: turn j+1 arrives when turn j has finished plus
    # the trace's gap between them (not at its own trace time). Turn 0 keeps its trace time.
    causal: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas <= 0:
            raise InputError("replicas", f"must be a positive integer, got {self.replicas!r}")
        if isinstance(self.capacity_blocks, bool) or not isinstance(self.capacity_blocks, int) or self.capacity_blocks <= 0:
            raise InputError("capacity_blocks", f"must be a positive integer, got {self.capacity_blocks!r}")
        policy_class(self.policy)  # unknown names list the valid ones
        get_strategy(self.routing)


@dataclass(slots=True)
class _Replica:
    rid: str
    pool: BlockPool
    sched: Scheduler
    state: ReplicaState
    busy_until: float = INF
    pending: object = None  # the StepResult whose end is busy_until
    ttft: LogHistogram = field(default_factory=LogHistogram)
    busy_s: float = 0.0  # emulated seconds spent in scheduler steps


def next_use_times(trace: Trace) -> list[list[float]]:
    """For each request and block, the time of that block's next request (inf if none)."""
    nxt: dict[int, float] = {}
    out: list[list[float]] = [[]] * len(trace.requests)
    for k in range(len(trace.requests) - 1, -1, -1):
        r = trace.requests[k]
        get = nxt.get
        out[k] = [get(h, INF) for h in r.hash_ids]
        for h in r.hash_ids:
            nxt[h] = r.t
    return out


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


def _build_replica(i: int, s: SimSettings, block_size: int, cost: CostModel) -> _Replica:
    core = build_core(CoreSettings(
        capacity_blocks=s.capacity_blocks, policy=s.policy, policy_params=s.policy_params, block_size=block_size,
        hit_mode=s.hit_mode, token_budget=s.token_budget, max_running=s.max_running,
        reuse="exact" if s.reuse_distances else "off", seed=s.seed, emit_events=False, oracles=True), cost)
    rid = f"replica-{i}"  # the ids `kvemu up` gives, so session routing hashes the same ring
    return _Replica(rid, core.pool, core.scheduler, ReplicaState(rid, capacity_blocks=s.capacity_blocks))


class Simulation:
    def __init__(self, trace: Trace, settings: SimSettings, progress: Callable[[int, int], None] | None = None):
        self.trace = trace
        self.s = settings
        self.cost = CostModel.from_names(settings.model, settings.gpu)
        self.block_size = trace.block_size
        self.replicas = [_build_replica(i, settings, trace.block_size, self.cost) for i in range(settings.replicas)]
        self.by_id = {r.rid: r for r in self.replicas}
        self.strategy = get_strategy(settings.routing)
        self.routing = settings.routing_settings or RoutingSettings(block_size=trace.block_size)
        self.rng = random.Random(settings.seed)
        self.memory = RouterMemory()
        self.progress = progress
        self.e2e = LogHistogram()
        self.queue = LogHistogram()
        self.ttft = LogHistogram()
        self.decisions: dict[str, int] = {}
        self.served = 0
        self.first_arrival = self.last_arrival = self.last_finish = 0.0

    def run(self) -> dict:
        reqs = self.trace.requests
        oracle = policy_class(self.s.policy).needs_future
        future = next_use_times(self.trace) if oracle else None
        busy: list[tuple[float, int, str]] = []  # (step end, tiebreak, replica id)
        arrivals = _Arrivals(reqs, self.s.causal)
        self._arrivals = arrivals
        seq = 0
        t0 = time.perf_counter()
        n = len(reqs)
        for i in range(n + 1):
            t_next = arrivals.peek()
            while busy and busy[0][0] <= t_next:
                end, _, rid = heapq.heappop(busy)
                rep = self.by_id[rid]
                self._complete_step(rep, end)  # may release a session's next turn (causal)
                t_next = arrivals.peek()
                seq = self._start_step(rep, end, t_next, busy, seq)
            if i == n or t_next == INF:  # INF: a session waits on a request that can never run
                break
            t, k = arrivals.pop()
            if i == 0:
                self.first_arrival = t
            self.last_arrival = t
            r = reqs[k]
            rep = self._route(r)
            rep.sched.submit(SchedRequest(k, r.hash_ids, r.input_tokens, max(r.output_tokens, 1), t, r.session,
                                          future[k] if future else None))
            rep.state.queued_tokens = rep.sched.queued_prefill_tokens
            if rep.busy_until == INF:
                seq = self._start_step(rep, t, arrivals.peek(), busy, seq)
            if self.progress and i % 2000 == 0:
                self.progress(i, n)
        if self.progress:
            self.progress(n, n)
        return self._report(time.perf_counter() - t0)

    def _route(self, r) -> _Replica:
        states = [rep.state for rep in self.replicas]
        overlap = {}
        if self.s.routing == "cache_aware":
            overlap = {rep.rid: rep.pool.prefix_match(r.hash_ids) for rep in self.replicas}
        decision = self.strategy(states, RouteRequest(r.session, len(r.hash_ids), r.input_tokens), overlap,
                                 self.routing, self.rng, self.memory)
        self.decisions[decision.reason] = self.decisions.get(decision.reason, 0) + 1
        rep = self.by_id[decision.replica_id]
        rep.state.in_flight += 1  # counted at decision time, before the replica sees it
        return rep

    def _start_step(self, rep: _Replica, now: float, horizon: float, busy: list, seq: int) -> int:
        if not rep.sched.has_work():
            rep.busy_until = INF
            return seq
        res = rep.sched.step(now, horizon)
        if res.duration <= 0 and not res.finished and not res.first_tokens and not res.decoded:
            rep.busy_until = INF  # nothing could run; the next arrival or completion restarts it
            return seq
        rep.busy_until = now + res.duration
        rep.busy_s += res.duration
        rep.pending = res
        heapq.heappush(busy, (rep.busy_until, seq, rep.rid))
        return seq + 1

    def _complete_step(self, rep: _Replica, end: float) -> None:
        res = rep.pending
        rep.pending = None
        for r in res.first_tokens:
            ttft = r.t_first_token - r.arrival
            self.ttft.add(ttft)
            rep.ttft.add(ttft)
            self.queue.add(r.t_admitted - r.arrival)
        for r in res.finished:
            self._arrivals.finished(r.rid, r.t_finished)
            self.e2e.add(r.t_finished - r.arrival)
            self.last_finish = max(self.last_finish, r.t_finished)
            rep.state.in_flight -= 1
            self.served += 1
        rep.state.queued_tokens = rep.sched.queued_prefill_tokens
        rep.state.kv_usage = rep.pool.usage()

    def _report(self, wall_s: float) -> dict:
        per = []
        tot = {"block_accesses": 0, "block_hits": 0, "tokens_queried": 0, "tokens_hit": 0, "cost_total": 0.0,
               "cost_hit": 0.0, "holes": 0, "requests": 0, "evictions": 0}
        for rep in self.replicas:
            st = rep.pool.stats()
            m = rep.pool.metrics
            st["replica"] = rep.rid
            st["ttft_p50_s"] = rep.ttft.quantile(0.5)
            st["ttft_p99_s"] = rep.ttft.quantile(0.99)
            st["busy_s"] = rep.busy_s
            per.append(st)
            for key in ("block_accesses", "block_hits", "tokens_queried", "tokens_hit", "requests", "evictions"):
                tot[key] += st[key]
            tot["cost_total"] += m.cost_total
            tot["cost_hit"] += m.cost_hit
            tot["holes"] += m.holes_total
        acc = tot["block_accesses"]
        reqs = [p["requests"] for p in per]
        mean_load = sum(reqs) / len(reqs) if reqs else 0
        return {
            "policy": self.s.policy,
            "capacity_blocks": self.s.capacity_blocks,
            "capacity_gib": round(self.cost.blocks_to_gib(self.s.capacity_blocks, self.block_size), 3),
            "replicas": self.s.replicas,
            "routing": self.s.routing,
            "hit_mode": self.s.hit_mode,
            "max_running": self.s.max_running,
            "block_size": self.block_size,
            "model": self.cost.model.name,
            "gpu": self.cost.gpu.name,
            "requests": tot["requests"],
            "served": self.served,
            "block_accesses": acc,
            "block_hit_ratio": tot["block_hits"] / acc if acc else 0.0,
            "token_hit_ratio": tot["tokens_hit"] / tot["tokens_queried"] if tot["tokens_queried"] else 0.0,
            "csr": tot["cost_hit"] / tot["cost_total"] if tot["cost_total"] else 0.0,
            "holes": {"total": tot["holes"], "mean_per_request": tot["holes"] / tot["requests"] if tot["requests"] else 0.0},
            "evictions": tot["evictions"],
            "ttft_p50_s": self.ttft.quantile(0.5),
            "ttft_p99_s": self.ttft.quantile(0.99),
            "queue_p99_s": self.queue.quantile(0.99),
            "e2e_p50_s": self.e2e.quantile(0.5),
            "e2e_p99_s": self.e2e.quantile(0.99),
            "load_imbalance": (max(reqs) / mean_load) if mean_load else 0.0,
            "arrival_span_s": self.last_arrival - self.first_arrival,
            "drain_s": max(self.last_finish - self.last_arrival, 0.0),
            "saturated": self._saturated(per),
            "routing_decisions": dict(sorted(self.decisions.items())),
            "per_replica": per,
            "wall_s": round(wall_s, 3),
        }


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
    return (f"{head}: the replica queue grew without bound (the last request finished {_duration(w['drain_s'])}"
            f" after the last arrival, over a {_duration(w['arrival_span_s'])} trace), so TTFT is mostly queueing;"
            f" raise --max-running (now {w['max_running']}) or --replicas (now {w['replicas']}), or lower the load")


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.1f} s"


def simulate(trace: Trace, settings: SimSettings, progress=None) -> dict:
    return Simulation(trace, settings, progress).run()


def stderr_progress(label: str) -> Callable[[int, int], None]:
    """Progress on stderr: a live line on a terminal, a plain line every 5 s otherwise."""
    tty = sys.stderr.isatty()
    every = 0.5 if tty else 5.0
    start = time.monotonic()
    last = [start]

    def show(done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - last[0] < every:
            return
        last[0] = now
        pct = 100.0 * done / total if total else 100.0
        line = f"{label}: {done:,}/{total:,} requests ({pct:5.1f}%) {now - start:6.1f}s"
        if tty:
            sys.stderr.write("\r" + line + ("\n" if done >= total else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    return show
