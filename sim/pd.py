"""Disaggregated prefill and decode in virtual time (replica/core/disagg.py says what P/D is).

``PdSimulation`` runs the simulator's replicas in pools: colocated replicas (role ``both``), prefill
instances and decode instances, each pool with its own GPU, capacity and tiers. A request's path is
vLLM's disaggregated serving: the decode instance is routed first (the strategy over the decode pool
and the colocated replicas, which prefill their own requests), the decider says whether the prompt
goes through a remote prefill, the prefill instance is routed (the strategy over the prefill pool),
computes the prompt (one output token, its blocks held), and when it finishes the decode instance
reserves the prompt's blocks (``Scheduler.reserve_remote``: a local prefill on the decode instance when it
cannot, counted as a failover), the KV it lacks crosses the network (``PdNetwork``: each NIC direction
shared by the transfers on it), the prefill instance's blocks go back, and the decode instance
computes the prompt's last token (its first token) and decodes.

One event loop over arrivals, step ends and transfer checks. A transfer's delivery is projected when
it starts and checked when that time comes: a transfer started later can only delay it (processor
sharing), so a check that finds it not yet done re-queues it at the new projection.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from dataclasses import dataclass

from replica.core.disagg import PdNetwork, PdTransfer
from replica.core.sched.scheduler import SchedRequest, Scheduler
from router.strategies import RouteRequest, RoutingStep, strategy_spec
from shared.costmodel import CostModel, split_tp
from shared.histogram import LogHistogram
from shared.plotting import replicas_phrase
from shared.ratios import CacheCounts
from sim.settings import SimSettings
from sim.simulator import INF, NextUses, Simulation, _Arrivals, _build_replica, _Replica

STEP, TRANSFER = 0, 1  # event kinds


@dataclass(slots=True)
class _Flight:
    """One request through a remote prefill: its two halves and where it stands."""

    pre: SchedRequest  # on the prefill instance (one output token, blocks held until the transfer ends)
    dec: SchedRequest  # on the decode instance
    p: _Replica
    d: _Replica
    transfer: PdTransfer | None = None
    delivered: float = -1.0


class PdSimulation(Simulation):
    def __init__(self, trace, settings: SimSettings, progress=None) -> None:
        assert settings.pd is not None
        self.pd = settings.pd
        self.roles = dict(self.pd.topology(settings.replicas).members())
        self.costs: dict[str, CostModel] = {}
        super().__init__(trace, settings, progress)
        self.decoders = [rep for rep in self.replicas if self.roles[rep.replica_id] != "prefill"]
        self.prefillers = [rep for rep in self.replicas if self.roles[rep.replica_id] == "prefill"]
        self.dec_states = [rep.state for rep in self.decoders]
        self.pre_states = [rep.state for rep in self.prefillers]
        self.prefill_router = RoutingStep(strategy_spec(self.pd.prefill_routing or settings.routing),
                                          self.router.settings, settings.seed + 1)
        link = self.pd.settings
        self.network = PdNetwork(link.link_latency_s)
        for rep in self.replicas:
            if self.roles[rep.replica_id] != "both":
                gpu, tp = split_tp(self._gpu(rep.replica_id))
                self.network.add(rep.replica_id, link.nic_bytes_per_s(gpu, tp))
        self.flights: dict[int, _Flight] = {}
        self.routed = dict.fromkeys(self.roles, 0)  # requests each instance was given (decoded, or prefilled)
        self.counts = {"remote": 0, "local": 0, "failover": 0}
        self.transfer_bytes = self.transfer_tokens = self.saved_tokens = 0
        self.split = {name: LogHistogram() for name in ("queue", "prefill", "transfer", "first_decode")}
        self._heap: list[tuple[float, int, int, str | int]] = []
        self._eseq = 0

    # ---- the pools -------------------------------------------------------------
    def _gpu(self, replica_id: str) -> str:
        shape = self.pd.shape(self.roles[replica_id])
        return shape.gpu or self.s.gpu

    def _pool_settings(self, replica_id: str) -> SimSettings:
        """The settings one instance runs: the cluster's, with its pool's shape (a prefill instance never
        stores response KV: the decode instance generated it)."""
        role = self.roles[replica_id]
        shape = self.pd.shape(role)
        return dataclasses.replace(
            self.s, pd=None, replicas=1, gpu=shape.gpu or self.s.gpu,
            capacity_blocks=shape.capacity_blocks or self.s.capacity_blocks,
            tiers=shape.tiers if shape.tiers is not None else self.s.tiers,
            response_kv="drop" if role == "prefill" else self.s.response_kv)

    def _build(self, s: SimSettings, events: bool, hashes_fit: bool) -> list[_Replica]:
        out = []
        stores = self._shared_stores(s.tiers, len(self.roles))
        for i, (replica_id, _) in enumerate(self.roles.items()):
            ps = self._pool_settings(replica_id)
            cost = self.costs.setdefault(replica_id, CostModel.from_names(ps.model, ps.gpu))
            out.append(_build_replica(i, ps, self.trace.block_size, cost, events, len(self.trace.requests),
                                      hashes_fit, replica_id, stores[i] if stores else None))
        return out

    def _wants_index(self, s: SimSettings) -> bool:
        return True  # the decider asks what the decode instance holds, whatever the strategy

    def _refusers(self) -> list[Scheduler]:
        firsts: dict[str, Scheduler] = {}
        for rep in self.replicas:
            firsts.setdefault(self.roles[rep.replica_id], rep.sched)
        return list(firsts.values())

    # ---- the loop --------------------------------------------------------------
    def run(self) -> dict:
        from replica.core.cache.policies import policy_class
        future = NextUses(self.trace) if policy_class(self.s.policy).needs_future else None
        reqs = self.trace.requests
        self._arrivals = arrivals = _Arrivals(reqs, self.s.causal)
        kick: list[_Replica] = []
        t0 = time.perf_counter()
        n, seen = len(reqs), 0
        heap = self._heap
        while True:
            t_arr = arrivals.peek()
            t_ev = heap[0][0] if heap else INF
            if t_ev == INF and t_arr == INF:
                break
            if t_ev <= t_arr:
                now, _, _, key = heapq.heappop(heap)
                if isinstance(key, str):  # STEP: a replica's step ended
                    self._step_ended(self.by_id[key], now, kick)
                else:  # TRANSFER: a request's KV may have landed
                    self._transfer_due(self.flights[key], now, kick)
            else:
                now, k = arrivals.pop()
                if seen == 0:
                    self.first_arrival = now
                self.last_arrival = now
                self._arrive(k, now, future, kick)
                seen += 1
                if self.progress and seen % 2000 == 0:
                    self.progress(seen, n)
            if kick and min(arrivals.peek(), heap[0][0] if heap else INF) > now:
                for rep in kick:  # a replica kicked twice starts once: it is busy after the first
                    if rep.busy_until == INF:
                        self._start(rep, now)
                kick.clear()
        if self.progress:
            self.progress(n, n)
        return self._report(time.perf_counter() - t0)

    def _push(self, at: float, kind: int, key: str | int) -> None:
        self._eseq += 1
        heapq.heappush(self._heap, (at, self._eseq, kind, key))

    def _start(self, rep: _Replica, now: float) -> None:
        if not rep.sched.has_work():
            return
        # a decode run may fast-forward only up to the next event anywhere: a transfer can land then
        horizon = min(self._arrivals.peek(), self._heap[0][0] if self._heap else INF)
        res = rep.sched.step(now, horizon)
        self._sync(rep)
        if res.duration <= 0 and not res.finished and not res.first_tokens and not res.decoded:
            return  # nothing could run: the next arrival, delivery or release restarts it
        rep.busy_until = now + res.duration
        rep.busy_s += res.duration
        rep.pending = res
        self._push(rep.busy_until, STEP, rep.replica_id)

    def _sync(self, rep: _Replica) -> None:
        if self.index is not None:
            self.index.sync(rep.replica_id, rep.pool)

    def _arrive(self, k: int, t: float, future: NextUses | None, kick: list[_Replica]) -> None:
        r = self.trace.requests[k]
        view = self._views[k] = RouteRequest(r.session, len(r.hash_ids), r.input_tokens)
        overlap = self._overlap(r)
        _, pos = self.router.route(self.dec_states, view, overlap)
        d = self.decoders[pos]
        self.routed[d.replica_id] += 1
        nxt, at = (future.of(k), future.position(k)) if future else (None, None)
        dec = SchedRequest(k, r.hash_ids, r.input_tokens, max(r.output_tokens, 1), t, r.session, nxt, at)
        if self.responses is not None:
            dec.response_hashes = self.responses[k]
        cached = min(overlap.get(d.replica_id, 0) * self.block_size, r.input_tokens)
        if self.roles[d.replica_id] == "both" or not self.pd.settings.remote(r.input_tokens, cached, self.block_size):
            self.counts["local"] += 1
            self._submit(d, dec, kick)
            return
        self.counts["remote"] += 1
        _, ppos = self.prefill_router.route(self.pre_states, view, overlap)
        p = self.prefillers[ppos]
        self.routed[p.replica_id] += 1
        pre = SchedRequest(k, r.hash_ids, r.input_tokens, 1, t, r.session, nxt, at)
        pre.hold = True
        self.flights[k] = _Flight(pre, dec, p, d)
        self._submit(p, pre, kick)

    @staticmethod
    def _submit(rep: _Replica, req: SchedRequest, kick: list[_Replica]) -> None:
        rep.sched.submit(req)
        rep.state.queued_tokens = rep.sched.queued_prefill_tokens
        kick.append(rep)

    def _step_ended(self, rep: _Replica, now: float, kick: list[_Replica]) -> None:
        res = rep.pending
        assert res is not None
        rep.pending, rep.busy_until = None, INF
        prefill = self.roles[rep.replica_id] == "prefill"
        for r in res.first_tokens:
            rep.ttft.add(r.t_first_token - r.arrival)  # a prefill instance's own: its one token
            flight = self.flights.get(r.rid)
            if prefill or flight is None:
                self.queue.add(r.waited)
            elif flight.delivered >= 0:
                self.split["first_decode"].add(r.t_first_token - flight.delivered)
        for r in res.finished:
            if prefill:
                self._transfer_start(self.flights[r.rid], now, kick)
                continue
            self._arrivals.finished(r.rid, r.t_finished)
            self.e2e.add(r.t_finished - r.arrival)
            self._finished(r, rep.replica_id)
            self.last_finish = max(self.last_finish, r.t_finished)
            self.router.done(rep.state, self._views.pop(r.rid))
            self.served += 1
            self.flights.pop(r.rid, None)
        # (the pools' queues are their schedulers' own: P/D's live path, router/pd.py, learns no first token)
        rep.state.queued_tokens = rep.sched.queued_prefill_tokens
        rep.state.kv_usage = rep.live_pool.usage()
        kick.append(rep)

    def _transfer_start(self, fl: _Flight, now: float, kick: list[_Replica]) -> None:
        """The prefill finished: the decode instance reserves the prompt's blocks and the KV it lacks
        starts across; without room there, the decode instance prefills it itself (a failover)."""
        d, bs = fl.d, self.block_size
        if not d.sched.reserve_remote(fl.dec, now):
            self.counts["failover"] += 1
            self._release_prefill(fl, now, kick)
            del self.flights[fl.dec.rid]
            self._submit(d, fl.dec, kick)
            return
        self._sync(d)
        held = d.sched.reserved_hits(fl.dec)
        tokens = self.pd.settings.transfer_tokens(fl.dec.input_tokens, held, bs)
        self.saved_tokens += fl.dec.input_tokens - tokens
        nbytes = tokens * self.cost.kv_bytes_per_token
        self.transfer_tokens += tokens
        self.transfer_bytes += nbytes
        fl.transfer = self.network.start(now, fl.p.replica_id, d.replica_id, nbytes)
        self._push(self.network.finish(fl.transfer), TRANSFER, fl.dec.rid)

    def _transfer_due(self, fl: _Flight, now: float, kick: list[_Replica]) -> None:
        assert fl.transfer is not None
        if not self.network.settle(fl.transfer, now):  # a later transfer slowed it: check again then
            self._push(self.network.finish(fl.transfer), TRANSFER, fl.dec.rid)
            return
        fl.delivered = now
        pre = fl.pre
        self.split["queue"].add(pre.waited)
        self.split["prefill"].add(pre.t_first_token - pre.arrival - pre.waited)
        self.split["transfer"].add(now - pre.t_first_token)
        self._release_prefill(fl, now, kick)
        fl.d.sched.remote_arrived(fl.dec, now)
        fl.d.state.queued_tokens = fl.d.sched.queued_prefill_tokens
        kick.append(fl.d)

    def _release_prefill(self, fl: _Flight, now: float, kick: list[_Replica]) -> None:
        fl.p.sched.release_held(fl.pre, now)
        self.prefill_router.done(fl.p.state, self._views[fl.dec.rid])
        fl.p.state.queued_tokens = fl.p.sched.queued_prefill_tokens
        self._sync(fl.p)
        kick.append(fl.p)  # its queue may have waited for those blocks

    # ---- the report ------------------------------------------------------------
    def _latencies(self, timed: bool) -> dict[str, float | None]:
        out = Simulation._latencies(self, timed)
        ttft = LogHistogram()
        for rep in self.decoders:  # a request's first token comes from its decode (or colocated) instance
            ttft.merge(rep.ttft)
        for name, q in (("ttft_p50_s", 0.5), ("ttft_p95_s", 0.95), ("ttft_p99_s", 0.99)):
            out[name] = ttft.quantile(q) if timed else None
        return out

    def _report(self, wall_s: float) -> dict:
        out = Simulation._report(self, wall_s)
        for st in out["per_replica"]:
            st["role"] = self.roles[st["replica"]]
            st["gpu"] = self._gpu(st["replica"])
            # ``requests`` counts the prompts its pool looked up (a decode instance's remote ones are not)
            st["routed"] = self.routed[st["replica"]]
        routed = [self.routed[rep.replica_id] for rep in self.decoders]  # every request is decoded once
        mean = sum(routed) / len(routed)
        out["load_imbalance"] = max(routed) / mean if mean else 0.0
        out["routing_decisions"] = {"decode": out["routing_decisions"],
                                    "prefill": dict(sorted(self.prefill_router.decisions.items()))}
        out["pd"] = self._pd_report()
        return out

    def _pd_report(self) -> dict:
        link = self.pd.settings
        end = max(self.last_finish, self.last_arrival)
        split = {f"{name}_{q}_s": h.quantile(p) for name, h in self.split.items()
                 for q, p in (("p50", 0.5), ("p99", 0.99))}
        return {
            "topology": {"colocated": self.s.replicas, "prefill": self.pd.prefill, "decode": self.pd.decode},
            "decider": link.decider, "threshold_tokens": link.threshold(self.block_size), "transfer": link.transfer,
            "link_latency_s": link.link_latency_s,
            "requests": dict(self.counts),
            "ttft_split": split,
            "transfer_tokens": self.transfer_tokens, "transfer_bytes": self.transfer_bytes,
            "saved_tokens": self.saved_tokens,  # prompt tokens the decode instance already held: not sent
            "links": self.network.stats(end),
            "pools": {role: self._pool_report(role) for role in ("both", "prefill", "decode")
                      if any(r == role for r in self.roles.values())},
        }

    def _pool_report(self, role: str) -> dict:
        reps = [rep for rep in self.replicas if self.roles[rep.replica_id] == role]
        counts = CacheCounts()
        for rep in reps:
            counts += rep.pool.metrics.counts()
        ttft = LogHistogram()
        for rep in reps:
            ttft.merge(rep.ttft)
        span = max(self.last_finish - self.first_arrival, 1e-12)
        cap = sum(rep.state.capacity_blocks for rep in reps)
        routed = [self.routed[rep.replica_id] for rep in reps]
        mean = sum(routed) / len(routed)
        return {"replicas": len(reps), "gpu": self._gpu(reps[0].replica_id),
                "routed": sum(routed), "load_imbalance": max(routed) / mean if mean else 0.0,
                "capacity_blocks": reps[0].state.capacity_blocks, **counts.ratios(),
                "preemptions": sum(rep.sched.preemptions for rep in reps),
                "kv_usage_mean": sum(rep.sched.pinned_block_s for rep in reps) / (span * cap),
                "busy_fraction": sum(rep.busy_s for rep in reps) / (span * len(reps)),
                "ttft_p50_s": ttft.quantile(0.5), "ttft_p99_s": ttft.quantile(0.99)}


def cluster_label(run: dict) -> str:
    """A run's replicas as the tables and figures name them: ``4``, or a P/D cluster's pools, ``2P:2D``
    (``2P:2D+1``: one colocated replica beside them); ``run["replicas"]`` counts only colocated ones."""
    topo = (run.get("pd") or {}).get("topology")
    if not topo:
        return str(run["replicas"])
    return f"{topo['prefill']}P:{topo['decode']}D" + (f"+{topo['colocated']}" if topo["colocated"] else "")


def cluster_phrase(run: dict) -> str:
    """What a figure's title says of a run's cluster: '1 replica', '4 replicas, cache_aware routing', or
    'P/D 2P:2D (prefill:decode instances), cache_aware routing'."""
    if not (run.get("pd") or {}).get("topology"):
        return replicas_phrase(run["replicas"], run["routing"])
    return f"P/D {cluster_label(run)} (prefill:decode instances), {run['routing']} routing"
