"""Data-parallel instances in virtual time (replica/core/dp.py says what a DP group is).

``DpSimulation`` runs each of the ``replicas`` instances as ``data_parallel_size`` ranks, each the
simulator's own replica (a core with its scheduler and pool, id ``replica-<i>/dp<r>``). The router routes
to instances (one ``ReplicaState`` an instance, which its ranks share: in-flight and queued counts are the
instance's; the index's hits per rank are folded into the instance's best); the instance's ``DpGroup``
then picks the rank by vLLM's waiting x 4 + running. Without expert parallelism the ranks step on their own,
through the simulator's loop unchanged. With it they step in lockstep: the first rank started starts the
group's step (``DpGroup.lockstep_step``: every rank, or its dummy batch), each rank's step ends when the
group's does, and the next group step starts once every rank's end has been taken; a request arriving at a
rank meanwhile joins at that boundary, as an idle rank's dummy steps keep it in the group's rhythm.
"""

from __future__ import annotations

from replica.core.dp import DpGroup, DpSettings
from replica.core.sched.scheduler import StepResult
from router.strategies import ReplicaState, RouteRequest
from shared.expert_parallel import check_expert_parallel
from sim.settings import SimSettings
from sim.simulator import INF, STEP_END, Replica, Simulation, build_replica


class DpSimulation(Simulation):
    def __init__(self, trace, settings: SimSettings, progress=None) -> None:
        self.dp = DpSettings(settings.data_parallel_size, settings.expert_parallel)
        super().__init__(trace, settings, progress)
        check_expert_parallel(self.cost.model, settings.expert_parallel, settings.data_parallel_size,
                              "expert_parallel")
        n = self.dp.size
        self.instances = [self.replicas[i * n:(i + 1) * n] for i in range(settings.replicas)]
        self.groups = [DpGroup([rep.core for rep in ranks], self.cost, self.dp) for ranks in self.instances]
        self.group_of = {rep.replica_id: k for k, ranks in enumerate(self.instances) for rep in ranks}
        self.instance_of = {rep.replica_id: ranks[0].state.replica_id for ranks in self.instances for rep in ranks}
        self.states = [ranks[0].state for ranks in self.instances]
        self.lockstep_steps = self.dummy_rank_steps = 0
        self.all_to_all_s = 0.0

    def _build(self, s: SimSettings, events: bool, hashes_fit: bool) -> list[Replica]:
        n = s.data_parallel_size
        stores = self._shared_stores(s.tiers, s.replicas)
        out = []
        for i in range(s.replicas):
            state = ReplicaState(f"replica-{i}", capacity_blocks=s.capacity_blocks * n)
            for r in range(n):
                rep = build_replica(i, s, self.trace.block_size, self.cost, events, len(self.trace.requests),
                                     hashes_fit, f"replica-{i}/dp{r}", stores[i] if stores else None)
                rep.state = state  # the router sees the instance
                out.append(rep)
        return out

    def _route(self, r) -> tuple[Replica, RouteRequest]:
        view = RouteRequest(r.session, len(r.hash_ids), r.input_tokens)
        if len(self.groups) == 1:
            self.router.only(self.states[0], view)
            pos = 0
        else:
            _, pos = self.router.route(self.states, view, self._overlap(r))
        group = self.groups[pos]
        rank = group.pick()
        group.routed[rank] += 1
        return self.instances[pos][rank], view

    def _overlap(self, r) -> dict[str, int]:
        """The index's blocks per rank (and ``<rank>#<level>``), each instance's best rank's."""
        out: dict[str, int] = {}
        for key, n in super()._overlap(r).items():
            rank_id, sep, level = key.partition("#")
            name = self.instance_of.get(rank_id, rank_id) + sep + level
            if n > out.get(name, 0):
                out[name] = n
        return out

    def _start_step(self, rep: Replica, now: float, horizon: float) -> None:
        if not self.dp.lockstep:
            super()._start_step(rep, now, horizon)
            return
        k = self.group_of[rep.replica_id]
        ranks = self.instances[k]
        if any(x.pending is not None for x in ranks):  # the group's step has not ended on every rank yet
            return
        step = self.groups[k].lockstep_step(now)
        if self.index is not None:
            for x in ranks:
                self.index.sync(x.replica_id, x.pool)
        if step.duration <= 0:
            for x in ranks:
                x.busy_until = INF  # nothing could run; the next arrival or completion restarts it
            return
        self.lockstep_steps += 1
        self.dummy_rank_steps += step.dummies
        self.all_to_all_s += step.all_to_all_s
        end = now + step.duration
        for x, res in zip(ranks, step.results, strict=True):
            x.pending = res if res is not None else StepResult(now, step.duration, 1, 0, [], [], [])
            x.busy_until = end
            x.busy_s += step.duration
            self._schedule(end, STEP_END, x.pos)

    def _complete_step(self, rep: Replica, now: float) -> None:
        super()._complete_step(rep, now)
        ranks = self.instances[self.group_of[rep.replica_id]]
        rep.state.kv_usage = sum(x.live_pool.usage() for x in ranks) / len(ranks)

    def _report(self, wall_s: float) -> dict:
        out = super()._report(wall_s)
        for entry, rep in zip(out["per_replica"], self.replicas, strict=True):
            entry["instance"], _, rank = rep.replica_id.partition("/dp")
            entry["dp_rank"] = int(rank)
        out["data_parallel"] = {
            "size": self.dp.size, "expert_parallel": self.dp.expert_parallel, "instances": len(self.groups),
            "routed_per_rank": [group.routed for group in self.groups],
            "lockstep_steps": self.lockstep_steps if self.dp.lockstep else None,
            "dummy_rank_steps": self.dummy_rank_steps if self.dp.lockstep else None,
            "all_to_all_s": self.all_to_all_s if self.dp.lockstep else None}
        return out
