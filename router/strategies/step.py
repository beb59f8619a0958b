"""One routing step, made the same way by the live router and the simulator.

The caller asks ``uses_index`` whether this strategy reads the prefix index and, if so,
looks the request up (the live router in its index with a timeout; the simulator in its
pools). ``route`` then calls the strategy, counts the decision by reason, and counts the
request in the chosen replica's ``in_flight`` and its prefill in ``queued_tokens`` at once,
before the next decision. ``prefilled`` takes the prefill out when the replica's first token
is out, ``done`` takes the request out when the replica has answered (or failed).

What a step counts as queued is the request's prefill on the chosen replica: its prompt
tokens less the prefix the index says that replica holds (``prefill_tokens``), from the
decision to the first token, as Dynamo's router counts a worker's prefill tokens (added at
routing, removed at its ``mark_prefill_completed``). The live router learns the first token
from the replica's answer head (sent at the first token, streamed or not: router/views.py);
the simulator from its scheduler's step. Counting a prompt until the whole answer instead
(as the live router did) charges every decoding request its full prompt as load: on the
README tour's replay it made cache_aware leave sessions' replicas for nothing.

It also counts turns that leave their session's replica: a request whose session this step
last sent elsewhere, by the reason of the decision that moved it (``session_moves``).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from router.strategies.base import ReplicaState, RouteDecision, RouteRequest, RouterMemory, RoutingContext, RoutingSettings, Strategy


@dataclass(frozen=True, slots=True)
class StrategySpec:
    """A registered strategy and what it needs from its caller."""

    name: str
    choose: Strategy
    uses_index: bool = False  # reads the prefix index's overlap per replica
    keeps_sessions: bool = False  # a conversation's turns stay on one replica while it is healthy


def prefill_tokens(request: RouteRequest, decision: RouteDecision, block_size: int) -> int:
    """The prefill ``request`` brings to the replica ``decision`` chose: its prompt less the prefix the index says
    that replica holds (the whole prompt where the strategy reads no index), never below 0."""
    cached = decision.predicted_cached_blocks * block_size
    return request.input_tokens - cached if request.input_tokens > cached else 0


class RoutingStep:
    def __init__(self, spec: StrategySpec, settings: RoutingSettings, seed: int | None = 0) -> None:
        self.spec = spec
        self.settings = settings
        self.context = RoutingContext(settings, random.Random(seed), RouterMemory())
        self.decisions: dict[str, int] = {}
        # turns whose session this step routed before, and those that left the replica it went to, by reason
        self.session_turns = 0
        self.session_moves: dict[str, int] = {}
        self.last_moved = ""  # the reason the latest routed turn left its session's replica; "" if it did not
        self._pos: dict[str, int] = {}  # replica id -> its latest position in ``replicas`` (checked on use)
        # (id(request), id(state)) -> (request, prefill tokens counted in state.queued_tokens until prefilled or
        # done); the request is kept so that its id is not reused while counted
        self._queued: dict[tuple[int, int], tuple[RouteRequest, int]] = {}
        self._sessions: OrderedDict[str, str] = OrderedDict()  # session -> replica id of its latest turn (LRU)

    @property
    def uses_index(self) -> bool:
        return self.spec.uses_index

    def route(self, replicas: Sequence[ReplicaState], request: RouteRequest,
              overlap: Mapping[str, int]) -> tuple[RouteDecision, int]:
        """The decision and the chosen replica's position in ``replicas``, already counted in flight."""
        decision = self.spec.choose(replicas, request, overlap, self.context)
        replica_id = decision.replica_id
        pos = self._pos.get(replica_id, -1)
        if not 0 <= pos < len(replicas) or replicas[pos].replica_id != replica_id:  # O(1) unless the list changed
            pos = self._pos[replica_id] = next(i for i, r in enumerate(replicas) if r.replica_id == replica_id)
        state = replicas[pos]
        self._count(decision.reason, state, request, prefill_tokens(request, decision, self.settings.block_size))
        self.last_moved = self._follow(request.session, replica_id, decision.reason) if request.session else ""
        return decision, pos

    def only(self, state: ReplicaState, request: RouteRequest) -> None:
        """One replica, nothing to choose: count the request on it without asking the strategy."""
        self._count("only_replica", state, request, request.input_tokens)

    def count_only(self, requests: int) -> None:
        """``requests`` served one after another by one replica (each ``only``, then ``done``)."""
        if requests:
            self.decisions["only_replica"] = self.decisions.get("only_replica", 0) + requests

    def _count(self, reason: str, state: ReplicaState, request: RouteRequest, tokens: int) -> None:
        self.decisions[reason] = self.decisions.get(reason, 0) + 1
        state.in_flight += 1  # counted at decision time, before the replica sees it
        if tokens:
            state.queued_tokens += tokens
            key = (id(request), id(state))
            held = self._queued.get(key)
            self._queued[key] = (request, tokens + (held[1] if held is not None else 0))

    def _follow(self, session: str, replica_id: str, reason: str) -> str:
        """Remember where ``session``'s turn went; the reason when it left the replica of the one before."""
        sessions = self._sessions
        prev = sessions.get(session)
        if prev is None:
            sessions[session] = replica_id
            if len(sessions) > self.settings.max_sessions:
                sessions.popitem(last=False)
            return ""
        self.session_turns += 1
        sessions.move_to_end(session)
        if prev == replica_id:
            return ""
        sessions[session] = replica_id
        self.session_moves[reason] = self.session_moves.get(reason, 0) + 1
        return reason

    def prefilled(self, state: ReplicaState, request: RouteRequest) -> None:
        """The replica's first token for ``request`` is out: its prefill no longer counts as queued (once)."""
        held = self._queued.pop((id(request), id(state)), None)
        if held is not None:
            state.queued_tokens -= held[1]

    def done(self, state: ReplicaState, request: RouteRequest) -> None:
        """The replica answered (or failed): the request no longer counts against it."""
        state.in_flight -= 1
        self.prefilled(state, request)


def session_moves(step: RoutingStep) -> dict:
    """What ``step`` counted of turns that left their session's replica: ``turns`` that followed an earlier
    turn of their session, ``left`` of them went elsewhere, ``by_reason`` the decisions that sent them."""
    return {"turns": step.session_turns, "left": sum(step.session_moves.values()),
            "by_reason": dict(sorted(step.session_moves.items()))}
