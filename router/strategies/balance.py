"""Cache-oblivious strategies: round robin, uniform random, least loaded."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from router.strategies.base import NoHealthyReplica, ReplicaState, RouteDecision, RouteRequest, RoutingContext, decide, least_loaded_pick


def round_robin(replicas: Sequence[ReplicaState], request: RouteRequest, overlap: Mapping[str, int], ctx: RoutingContext) -> RouteDecision:
    """Next healthy replica after the previous pick, in list order."""
    n = len(replicas)
    if n:
        memory = ctx.memory
        start = memory.rr_next % n
        for step in range(n):
            i = (start + step) % n
            r = replicas[i]
            if r.healthy:
                # Kept modulo n so the counter never grows, and a shrinking list still works.
                memory.rr_next = (i + 1) % n
                return decide(r, "round_robin", overlap, request.num_blocks)
    raise NoHealthyReplica(n)


def random_choice(replicas: Sequence[ReplicaState], request: RouteRequest, overlap: Mapping[str, int],
                  ctx: RoutingContext) -> RouteDecision:
    """Uniform over healthy replicas, without building a filtered list."""
    healthy = 0
    for r in replicas:
        if r.healthy:
            healthy += 1
    if not healthy:
        raise NoHealthyReplica(len(replicas))
    k = int(ctx.rng.random() * healthy)
    for r in replicas:
        if r.healthy:
            if k == 0:
                return decide(r, "random", overlap, request.num_blocks)
            k -= 1
    raise AssertionError("unreachable: k < healthy")


def least_loaded(replicas: Sequence[ReplicaState], request: RouteRequest, overlap: Mapping[str, int], ctx: RoutingContext) -> RouteDecision:
    """Fewest in-flight requests, then fewest queued tokens; ties broken at random."""
    return decide(least_loaded_pick(replicas, ctx.rng), "least_loaded", overlap, request.num_blocks)
