"""Disaggregated prefill and decode in virtual time (replica/core/disagg.py says what P/D is).

``PdFlow`` is the P/D component of the simulator's one loop (sim/simulator.py, ``Simulation``): a
``Simulation`` given ``SimSettings.pd`` runs its replicas in pools, colocated replicas (role ``both``),
prefill instances and decode instances, each pool with its own GPU, capacity and tiers, and calls the
component at the four points where P/D differs. A request's path is vLLM's disaggregated serving:

* arrival (``arrive``): the decode instance is routed first (the strategy over the decode pool and the
  colocated replicas, which prefill their own requests), the decider says whether the prompt goes
  through a remote prefill, the prefill instance is routed (the strategy over the prefill pool), which
  computes the prompt (one output token, its blocks held);
* the prefill leg's end (``leg_done``): the decode instance reserves the prompt's blocks
  (``Scheduler.reserve_remote``: a local prefill on the decode instance when it cannot, counted as a
  failover) and the KV it lacks starts across the network (``PdNetwork``: each NIC direction shared by
  the transfers on it);
* the transfer's event (``kv_due``, the loop's ``KV_DUE``): a transfer's delivery is projected when it
  starts and checked when that time comes; a transfer started later can only delay it (processor
  sharing), so a check that finds it not yet done queues it again at the new projection. Once delivered,
  the prefill instance's blocks go back (the release) and the decode instance computes the prompt's last
  token (its first token) and decodes;
* the report (``instance_fields``, ``decode_loads``, ``routing_decisions``, ``report``), which
  sim/report.py asks as it builds the run's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from loadgen.trace import TraceRequest
from replica.core.disagg import PdCluster, PdNetwork, PdTransfer
from replica.core.sched.scheduler import SchedRequest
from router.strategies import RouteRequest, RoutingStep, strategy_spec
from shared.costmodel import CostModel, split_tp
from shared.histogram import LogHistogram
from shared.plotting import replicas_phrase
from shared.ratios import CacheCounts
from sim.settings import SimSettings

if TYPE_CHECKING:
    from sim.simulator import Replica, Simulation

@dataclass(slots=True)
class _Flight:
    """One request through a remote prefill: its two halves and where it stands."""

    pre: SchedRequest  # on the prefill instance (one output token, blocks held until the transfer ends)
    dec: SchedRequest  # on the decode instance
    p: Replica
    d: Replica
    view: RouteRequest  # its routing view (the prefill router's load counts take it back at the release)
    transfer: PdTransfer | None = None
    delivered: float = -1.0


class PdFlow:
    """A P/D cluster's part of one simulation: its instances, routers, network and counts."""

    def __init__(self, settings: SimSettings) -> None:
        assert settings.pd is not None
        self.s = settings
        self.cluster: PdCluster = settings.pd
        self.roles = dict(self.cluster.topology(settings.replicas).members())
        self.costs: dict[str, CostModel] = {}
        self.routed = dict.fromkeys(self.roles, 0)  # requests each instance was given (decoded, or prefilled)
        self.counts = {"remote": 0, "local": 0, "failover": 0}
        self.transfer_bytes = self.transfer_tokens = self.saved_tokens = 0
        self.split = {name: LogHistogram() for name in ("queue", "prefill", "transfer", "first_decode")}
        self.flights: dict[int, _Flight] = {}

    # ---- the instances -----------------------------------------------------------
    def gpu(self, replica_id: str) -> str:
        return self.cluster.shape(self.roles[replica_id]).gpu or self.s.gpu

    def instance_settings(self, replica_id: str) -> tuple[SimSettings, CostModel]:
        """The settings one instance runs, and its cost model: the cluster's, with its pool's shape (a prefill
        instance never stores response KV: the decode instance generated it)."""
        role = self.roles[replica_id]
        shape = self.cluster.shape(role)
        knobs = self.s.knobs
        knobs = dataclasses.replace(knobs, tiers=shape.tiers if shape.tiers is not None else knobs.tiers,
                                    response_kv="drop" if role == "prefill" else knobs.response_kv)
        ps = dataclasses.replace(self.s, pd=None, replicas=1, gpu=shape.gpu or self.s.gpu,
                                 capacity_blocks=shape.capacity_blocks or self.s.capacity_blocks, knobs=knobs)
        return ps, self.costs.setdefault(replica_id, CostModel.from_names(ps.model, ps.gpu))

    def attach(self, sim: Simulation) -> None:
        """The built simulation: its pools, the prefill pool's router and every P/D instance's NIC."""
        self.sim = sim
        self.decoders = [rep for rep in sim.replicas if rep.role != "prefill"]
        self.prefillers = [rep for rep in sim.replicas if rep.role == "prefill"]
        self.dec_states = [rep.state for rep in self.decoders]
        self.pre_states = [rep.state for rep in self.prefillers]
        self.prefill_router = RoutingStep(strategy_spec(self.cluster.prefill_routing or self.s.routing),
                                          sim.router.settings, self.s.knobs.seed + 1)
        link = self.cluster.settings
        self.network = PdNetwork(link.link_latency_s)
        for rep in sim.replicas:
            if rep.role != "both":
                gpu, tp = split_tp(self.gpu(rep.replica_id))
                self.network.add(rep.replica_id, link.nic_bytes_per_s(gpu, tp))

    # ---- the loop's calls --------------------------------------------------------
    def arrive(self, r: TraceRequest, dec: SchedRequest, t: float, overlap: dict[str, int]) -> RouteRequest:
        """Route request ``dec`` (``r`` of the trace) to its decode instance, and its prompt to a prefill
        instance where the decider says so; returns its routing view."""
        sim = self.sim
        view = RouteRequest(r.session, len(r.hash_ids), r.input_tokens)
        _, pos = sim.router.route(self.dec_states, view, overlap)
        d = self.decoders[pos]
        self.routed[d.replica_id] += 1
        cached = min(overlap.get(d.replica_id, 0) * sim.block_size, r.input_tokens)
        if d.role == "both" or not self.cluster.settings.remote(r.input_tokens, cached, sim.block_size):
            self.counts["local"] += 1
            self._submit(d, dec)
            return view
        self.counts["remote"] += 1
        _, ppos = self.prefill_router.route(self.pre_states, view, overlap)
        p = self.prefillers[ppos]
        self.routed[p.replica_id] += 1
        pre = SchedRequest(dec.rid, r.hash_ids, r.input_tokens, 1, t, r.session, dec.next_use, dec.position)
        pre.hold = True
        self.flights[dec.rid] = _Flight(pre, dec, p, d, view)
        self._submit(p, pre)
        return view

    @staticmethod
    def _teach(rep: Replica, req: SchedRequest) -> None:
        """Several KV cache groups: the instance's events learn each block's key in each (for the index)."""
        if rep.core.group_keys is not None:
            rep.core.group_keys.teach(req.hashes, req.response_hashes)

    def _submit(self, rep: Replica, req: SchedRequest) -> None:
        self._teach(rep, req)
        rep.sched.submit(req)
        rep.state.queued_tokens = rep.sched.queued_prefill_tokens
        self.sim.kick(rep)

    def first_token(self, rep: Replica, r: SchedRequest) -> None:
        """``r``'s first token on ``rep``: its queueing, or (after a transfer) the decode instance's part."""
        flight = self.flights.get(r.rid)
        if rep.role == "prefill" or flight is None:
            self.sim.queue.add(r.waited)
        elif flight.delivered >= 0:
            self.split["first_decode"].add(r.t_first_token - flight.delivered)

    def leg_done(self, rep: Replica, r: SchedRequest, now: float) -> bool:
        """``r`` finished on ``rep``: True where it was a prefill leg (its transfer starts now); else the request
        is done (the loop counts it)."""
        if rep.role != "prefill":
            self.flights.pop(r.rid, None)
            return False
        self._transfer_start(self.flights[r.rid], now)
        return True

    def _transfer_start(self, fl: _Flight, now: float) -> None:
        """The prefill finished: the decode instance reserves the prompt's blocks and the KV it lacks
        starts across; without room there, the decode instance prefills it itself (a failover)."""
        d, bs, sim = fl.d, self.sim.block_size, self.sim
        self._teach(d, fl.dec)
        if not d.sched.reserve_remote(fl.dec, now):
            self.counts["failover"] += 1
            self._release_prefill(fl, now)
            del self.flights[fl.dec.rid]
            self._submit(d, fl.dec)
            return
        sim.sync(d)
        held = d.sched.reserved_hits(fl.dec)
        tokens = self.cluster.settings.transfer_tokens(fl.dec.input_tokens, held, bs)
        self.saved_tokens += fl.dec.input_tokens - tokens
        nbytes = tokens * sim.cost.kv_bytes_per_token
        self.transfer_tokens += tokens
        self.transfer_bytes += nbytes
        fl.transfer = self.network.start(now, fl.p.replica_id, d.replica_id, nbytes)
        sim.schedule_kv(self.network.finish(fl.transfer), fl.dec.rid)

    def kv_due(self, rid: int, now: float) -> None:
        """Request ``rid``'s transfer may have landed: settle it, or queue it again where a later one slowed it."""
        fl = self.flights[rid]
        assert fl.transfer is not None
        if not self.network.settle(fl.transfer, now):  # a later transfer slowed it: check again then
            self.sim.schedule_kv(self.network.finish(fl.transfer), rid)
            return
        fl.delivered = now
        pre = fl.pre
        self.split["queue"].add(pre.waited)
        self.split["prefill"].add(pre.t_first_token - pre.arrival - pre.waited)
        self.split["transfer"].add(now - pre.t_first_token)
        self._release_prefill(fl, now)
        fl.d.sched.remote_arrived(fl.dec, now)
        fl.d.state.queued_tokens = fl.d.sched.queued_prefill_tokens
        self.sim.kick(fl.d)

    def _release_prefill(self, fl: _Flight, now: float) -> None:
        fl.p.sched.release_held(fl.pre, now)
        self.prefill_router.done(fl.p.state, fl.view)
        fl.p.state.queued_tokens = fl.p.sched.queued_prefill_tokens
        self.sim.sync(fl.p)
        self.sim.kick(fl.p)  # its queue may have waited for those blocks

    # ---- the report (sim/report.py asks) -------------------------------------------
    def instance_fields(self, rep: Replica) -> dict:
        # ``requests`` counts the prompts its pool looked up (a decode instance's remote ones are not)
        return {"role": rep.role, "gpu": self.gpu(rep.replica_id), "routed": self.routed[rep.replica_id]}

    def decode_loads(self) -> list[int]:
        """Requests each decode (or colocated) instance was given: every request is decoded once."""
        return [self.routed[rep.replica_id] for rep in self.decoders]

    def routing_decisions(self, decode: dict) -> dict:
        return {"decode": decode, "prefill": dict(sorted(self.prefill_router.decisions.items()))}

    def report(self, sim: Simulation) -> dict:
        link = self.cluster.settings
        end = max(sim.last_finish, sim.last_arrival)
        split = {f"{name}_{q}_s": h.quantile(p) for name, h in self.split.items()
                 for q, p in (("p50", 0.5), ("p99", 0.99))}
        return {
            "topology": {"colocated": self.s.replicas, "prefill": self.cluster.prefill, "decode": self.cluster.decode},
            "decider": link.decider, "threshold_tokens": link.threshold(sim.block_size), "transfer": link.transfer,
            "link_latency_s": link.link_latency_s,
            "requests": dict(self.counts),
            "ttft_split": split,
            "transfer_tokens": self.transfer_tokens, "transfer_bytes": self.transfer_bytes,
            "saved_tokens": self.saved_tokens,  # prompt tokens the decode instance already held: not sent
            "links": self.network.stats(end),
            "pools": {role: self._pool_report(sim, role) for role in ("both", "prefill", "decode")
                      if any(r == role for r in self.roles.values())},
        }

    def _pool_report(self, sim: Simulation, role: str) -> dict:
        reps = [rep for rep in sim.replicas if rep.role == role]
        counts = CacheCounts()
        for rep in reps:
            counts += rep.pool.metrics.counts()
        ttft = LogHistogram()
        for rep in reps:
            ttft.merge(rep.ttft)
        span = max(sim.last_finish - sim.first_arrival, 1e-12)
        cap = sum(rep.state.capacity_blocks for rep in reps)
        routed = [self.routed[rep.replica_id] for rep in reps]
        mean = sum(routed) / len(routed)
        return {"replicas": len(reps), "gpu": self.gpu(reps[0].replica_id),
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
