"""Cache-oblivious strategies: round robin, uniform random, least loaded."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from router.strategies.base import (
    NoHealthyReplica,
    ReplicaState,
    RouteDecision,
    RouteRequest,
    RouterMemory,
    RoutingSettings,
    cached_blocks,
    least_loaded_pick,
)


def round_robin(
    replicas: Sequence[ReplicaState],
    request: RouteRequest,
    overlap: Mapping[str, int],
    settings: RoutingSettings,
    rng: random.Random,
    memory: RouterMemory,
) -> RouteDecision:
    """Next healthy replica after the previous pick, in list order."""
    n = len(replicas)
    if n:
        start = memory.rr_next % n
        for step in range(n):
            i = (start + step) % n
            r = replicas[i]
            if r.healthy:
                # Kept modulo n so the counter never grows, and a shrinking list still works.
                memory.rr_next = (i + 1) % n
                return RouteDecision(r.replica_id, "round_robin",
                                     cached_blocks(overlap, r.replica_id, request.num_blocks))
    raise NoHealthyReplica(n)


def random_choice(
    replicas: Sequence[ReplicaState],
    request: RouteRequest,
    overlap: Mapping[str, int],
    settings: RoutingSettings,
    rng: random.Random,
    memory: RouterMemory,
) -> RouteDecision:
    """Uniform over healthy replicas, without building a filtered list."""
    healthy = 0
    for r in replicas:
        if r.healthy:
            healthy += 1
    if not healthy:
        raise NoHealthyReplica(len(replicas))
    k = int(rng.random() * healthy)
    for r in replicas:
        if r.healthy:
            if k == 0:
                return RouteDecision(r.replica_id, "random",
                                     cached_blocks(overlap, r.replica_id, request.num_blocks))
            k -= 1
    raise AssertionError("unreachable: k < healthy")


def least_loaded(
    replicas: Sequence[ReplicaState],
    request: RouteRequest,
    overlap: Mapping[str, int],
    settings: RoutingSettings,
    rng: random.Random,
    memory: RouterMemory,
) -> RouteDecision:
    """Fewest in-flight requests, then fewest queued tokens; ties broken at random."""
    r = least_loaded_pick(replicas, rng)
    return RouteDecision(r.replica_id, "least_loaded", cached_blocks(overlap, r.replica_id, request.num_blocks))
