"""Data-parallel instances in virtual time (replica/core/dp.py says what a DP group is).

``DpFlow`` is the DP component of the simulator's one loop (sim/simulator.py, ``Simulation``), as ``PdFlow`` is
P/D's: a ``Simulation`` given ``SimSettings.data_parallel_size`` > 1 runs each of its ``replicas`` instances as
that many ranks, each the simulator's own replica (a core with its scheduler and pool, id ``replica-<i>/dp<r>``,
the index's key of that rank: ``shared.index.base.dp_rank_key``), and calls the component where DP differs:

* the members (``members``): which replicas to build, and (``attach``) the instances they form; the router sees
  an instance (one ``ReplicaState`` its ranks share: in-flight and queued counts are the instance's);
* routing (``route``): as the live router routes (router/request_path.py), the index's blocks per rank folded
  into each instance's best (``fold_ranks``), the strategy picks the instance, and the request goes to the rank
  holding the prefix it counted on unless the requests in flight on the ranks it named are imbalanced
  (``chosen_rank``; counted as the live router counts its own, and taken out as the loop records them finished),
  else to the one the instance's ``DpGroup`` picks by vLLM's waiting x 4 + running;
* the step (``start_step``, with expert parallelism only): the ranks step in lockstep, the first rank started
  starts the group's step (``DpGroup.lockstep_step``: every rank, or its dummy batch), each rank's step ends
  when the group's does, and the next group step starts once every rank's end has been taken; a request
  arriving at a rank meanwhile joins at that boundary, as an idle rank's dummy steps keep it in the group's
  rhythm. Without expert parallelism the ranks step on their own, through the loop unchanged;
* the report (``rank_fields``, ``report``), which sim/report.py asks as it builds the run's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from loadgen.trace import TraceRequest
from replica.core.dp import DpGroup, DpSettings
from replica.core.sched.scheduler import StepResult
from router.strategies import ReplicaState, RouteRequest, chosen_rank, fold_ranks
from shared.costmodel import CostModel
from shared.expert_parallel import check_expert_parallel
from shared.index.base import dp_rank_key, split_dp_rank
from sim.settings import SimSettings

if TYPE_CHECKING:
    from sim.simulator import Replica, Simulation

INF = float("inf")


class DpFlow:
    """The DP instances' part of one simulation: their groups, the rank routing and the lockstep counts."""

    def __init__(self, settings: SimSettings, cost: CostModel) -> None:
        self.dp = DpSettings(settings.data_parallel_size, settings.expert_parallel)
        check_expert_parallel(cost.model, settings.expert_parallel, settings.data_parallel_size, "expert_parallel")
        self.lockstep = self.dp.lockstep
        self.counts_in_flight = not settings.cache_only  # cache_only: each request ends as it is served
        self.lockstep_steps = self.dummy_rank_steps = 0
        self.all_to_all_s = 0.0

    def members(self, replicas: int) -> list[tuple[int, str]]:
        """The replicas to build, in order: (the instance's position, the rank's id)."""
        return [(i, dp_rank_key(f"replica-{i}", r)) for i in range(replicas) for r in range(self.dp.size)]

    def attach(self, sim: Simulation) -> None:
        """The built simulation: its ranks grouped into instances, each instance one state the router sees."""
        self.sim = sim
        n = self.dp.size
        self.instances = [sim.replicas[i:i + n] for i in range(0, len(sim.replicas), n)]
        self.groups = [DpGroup([rep.core for rep in ranks], sim.cost, self.dp) for ranks in self.instances]
        self.group_of: dict[str, int] = {}
        for k, ranks in enumerate(self.instances):
            state = ReplicaState(split_dp_rank(ranks[0].replica_id)[0], capacity_blocks=ranks[0].state.capacity_blocks * n)
            for rep in ranks:
                rep.state = state
                self.group_of[rep.replica_id] = k
        self.states = [ranks[0].state for ranks in self.instances]
        # the requests routed to a rank by name, in flight (chosen_rank's load): per instance, per rank; and each
        # such request (by its trace entry's id) until the loop's finished records (read from ``seen`` on) show it
        self.rank_in_flight = [dict.fromkeys(range(n), 0) for _ in self.instances]
        self.named: dict[int, tuple[int, int]] = {}
        self.seen = 0

    # ---- the loop's calls --------------------------------------------------------
    def route(self, r: TraceRequest, view: RouteRequest, overlap: dict[str, int]) -> Replica:
        """The rank ``r`` goes to, as the live router sends it (the module docstring); counted in flight on its
        instance."""
        router = self.sim.router
        rank: int | None = None
        if len(self.groups) == 1 and not router.uses_index:  # nothing to choose: no strategy
            router.only(self.states[0], view)
            pos = 0
        else:
            folded, ranks = fold_ranks(overlap)
            decision, pos = router.route(self.states, view, folded)
            self._take_finished()
            rank = chosen_rank(ranks, decision.replica_id, decision.predicted_cached_blocks,
                               self.rank_in_flight[pos], router.settings)
        group = self.groups[pos]
        if rank is not None and self.counts_in_flight:
            self.rank_in_flight[pos][rank] += 1
            self.named[id(r)] = (pos, rank)
        rank = group.pick(rank)
        group.routed[rank] += 1
        return self.instances[pos][rank]

    def _take_finished(self) -> None:
        """The requests named to a rank that the loop has recorded finished since the last call, out of
        ``rank_in_flight``: its records, not a call of its own, say when a request ends."""
        done = self.sim.finished_requests.rid
        requests = self.sim.trace.requests
        for k in range(self.seen, len(done)):
            named = self.named.pop(id(requests[done[k]]), None)
            if named is not None:
                self.rank_in_flight[named[0]][named[1]] -= 1
        self.seen = len(done)

    def start_step(self, rep: Replica, now: float) -> None:
        """Lockstep: the group's next step over every rank, once every rank's last one has ended."""
        k = self.group_of[rep.replica_id]
        ranks = self.instances[k]
        if any(x.pending is not None for x in ranks):  # the group's step has not ended on every rank yet
            return
        step = self.groups[k].lockstep_step(now)
        for x in ranks:
            self.sim.sync(x)
        if step.duration <= 0:
            for x in ranks:
                x.busy_until = INF  # nothing could run; the next arrival or completion restarts it
            return
        self.lockstep_steps += 1
        self.dummy_rank_steps += step.dummies
        self.all_to_all_s += step.all_to_all_s
        for x, res in zip(ranks, step.results, strict=True):
            self.sim.step_started(x, res if res is not None else StepResult(now, step.duration, 1, 0, [], [], []), now)

    def kv_usage(self, rep: Replica) -> float:
        """What the router reads of ``rep``'s instance: its ranks' mean KV use."""
        ranks = self.instances[self.group_of[rep.replica_id]]
        return sum(x.live_pool.usage() for x in ranks) / len(ranks)

    # ---- the report (sim/report.py asks) -------------------------------------------
    def rank_fields(self, rep: Replica) -> dict:
        instance, rank = split_dp_rank(rep.replica_id)
        return {"instance": instance, "dp_rank": rank}

    def report(self) -> dict:
        lockstep = self.lockstep
        return {"size": self.dp.size, "expert_parallel": self.dp.expert_parallel, "instances": len(self.groups),
                "routed_per_rank": [group.routed for group in self.groups],
                "lockstep_steps": self.lockstep_steps if lockstep else None,
                "dummy_rank_steps": self.dummy_rank_steps if lockstep else None,
                "all_to_all_s": self.all_to_all_s if lockstep else None}
