"""Routing strategies: pure functions shared by the live router and the simulator.

Every strategy has the signature::

    strategy(replicas, request, overlap, ctx) -> RouteDecision

``replicas`` is the router's view at decision time, ``overlap`` maps replica id to the
longest cached prefix of this request in blocks (from the prefix index; missing = 0),
``ctx`` is the caller's ``RoutingContext``: its settings, the ``rng`` that breaks ties, its
``RouterMemory``.  No I/O, no asyncio,
no module state, O(replicas) per call (plus a ring walk for ``session``).  Unhealthy
replicas are never chosen; with none healthy, ``NoHealthyReplica`` is raised.

The caller must count the request in the chosen replica's ``in_flight`` (and
``queued_tokens``) right away, before the next decision.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import shared  # noqa: F401 - installs the compiled modules' finder before router.strategies.prefix is imported
from router.strategies.affinity import load_bound, session_affinity
from router.strategies.balance import least_loaded, random_choice, round_robin
from router.strategies.base import (
    REASONS,
    NoHealthyReplica,
    ReplicaState,
    RouteDecision,
    RouteRequest,
    RouterMemory,
    RoutingContext,
    RoutingSettings,
    Strategy,
    decide,
    least_loaded_pick,
)
from router.strategies.prefix import cache_aware, is_imbalanced, replica_cost
from router.strategies.ranks import chosen_rank, fold_ranks
from router.strategies.step import RoutingStep, StrategySpec, prefill_tokens, session_moves
from shared.errors import UnknownNameError

# Each strategy declares what it needs: callers ask ``uses_index`` instead of testing names.
SPECS: Mapping[str, StrategySpec] = MappingProxyType({spec.name: spec for spec in (
    StrategySpec("round_robin", round_robin),
    StrategySpec("random", random_choice),
    StrategySpec("least_loaded", least_loaded),
    StrategySpec("session", session_affinity, keeps_sessions=True),
    StrategySpec("cache_aware", cache_aware, uses_index=True, keeps_sessions=True),
)})

DEFAULT_STRATEGY = "cache_aware"


def strategy_spec(name: str) -> StrategySpec:
    """The strategy registered under ``name`` with what it needs; the error lists the valid names."""
    try:
        return SPECS[name]
    except (KeyError, TypeError):
        raise UnknownNameError("routing strategy", str(name), tuple(SPECS)) from None


def get_strategy(name: str) -> Strategy:
    """The strategy function registered under ``name``; the error lists the valid names."""
    return strategy_spec(name).choose


__all__ = [
    "DEFAULT_STRATEGY",
    "REASONS",
    "NoHealthyReplica",
    "ReplicaState",
    "RouteDecision",
    "RouteRequest",
    "RouterMemory",
    "RoutingContext",
    "RoutingSettings",
    "RoutingStep",
    "SPECS",
    "Strategy",
    "StrategySpec",
    "cache_aware",
    "chosen_rank",
    "decide",
    "fold_ranks",
    "get_strategy",
    "is_imbalanced",
    "least_loaded",
    "least_loaded_pick",
    "load_bound",
    "prefill_tokens",
    "random_choice",
    "replica_cost",
    "round_robin",
    "session_affinity",
    "session_moves",
    "strategy_spec",
]
