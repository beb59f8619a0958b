"""One routing step, made the same way by the live router and the simulator.

The caller asks ``uses_index`` whether this strategy reads the prefix index and, if so,
looks the request up (the live router in its index with a timeout; the simulator in its
pools). ``route`` then calls the strategy, counts the decision by reason, and counts the
request in the chosen replica's ``in_flight`` and ``queued_tokens`` at once, before the
next decision; ``done`` takes it out again when the replica has answered.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from router.strategies.base import ReplicaState, RouteDecision, RouteRequest, RouterMemory, RoutingSettings, Strategy


@dataclass(frozen=True, slots=True)
class StrategySpec:
    """A registered strategy and what it needs from its caller."""

    name: str
    choose: Strategy
    uses_index: bool = False  # reads the prefix index's overlap per replica
    keeps_sessions: bool = False  # a conversation's turns stay on one replica while it is healthy


class RoutingStep:
    def __init__(self, spec: StrategySpec, settings: RoutingSettings, seed: int | None = 0) -> None:
        self.spec = spec
        self.settings = settings
        self.rng = random.Random(seed)
        self.memory = RouterMemory()
        self.decisions: dict[str, int] = {}
        self._pos: dict[str, int] = {}  # replica id -> its latest position in ``replicas`` (checked on use)

    @property
    def uses_index(self) -> bool:
        return self.spec.uses_index

    def route(self, replicas: Sequence[ReplicaState], request: RouteRequest,
              overlap: Mapping[str, int]) -> tuple[RouteDecision, int]:
        """The decision and the chosen replica's position in ``replicas``, already counted in flight."""
        decision = self.spec.choose(replicas, request, overlap, self.settings, self.rng, self.memory)
        replica_id = decision.replica_id
        pos = self._pos.get(replica_id, -1)
        if not 0 <= pos < len(replicas) or replicas[pos].replica_id != replica_id:  # O(1) unless the list changed
            pos = self._pos[replica_id] = next(i for i, r in enumerate(replicas) if r.replica_id == replica_id)
        self._count(decision.reason, replicas[pos], request)
        return decision, pos

    def only(self, state: ReplicaState, request: RouteRequest) -> None:
        """One replica, nothing to choose: count the request on it without asking the strategy."""
        self._count("only_replica", state, request)

    def count_only(self, requests: int) -> None:
        """``requests`` served one after another by one replica (each ``only``, then ``done``)."""
        if requests:
            self.decisions["only_replica"] = self.decisions.get("only_replica", 0) + requests

    def _count(self, reason: str, state: ReplicaState, request: RouteRequest) -> None:
        self.decisions[reason] = self.decisions.get(reason, 0) + 1
        state.in_flight += 1  # counted at decision time, before the replica sees it
        state.queued_tokens += request.input_tokens

    @staticmethod
    def done(state: ReplicaState, request: RouteRequest) -> None:
        """The replica answered (or failed): the request no longer counts against it."""
        state.in_flight -= 1
        state.queued_tokens -= request.input_tokens
