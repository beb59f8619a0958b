"""Cache-aware routing: Dynamo's cost function behind SGLang's imbalance guard.

Cost of sending the request to healthy replica r, in **blocks of prefill work**::

    cost(r) = overlap_weight * blocks_to_prefill(r) + load(r)
    blocks_to_prefill(r) = num_blocks - overlap[r]          (overlap clamped to [0, num_blocks])
                           - sum over levels k >= 1 of (1 - hit_cost[k]) * lower[r][k]

``lower[r][k]`` (the overlap map's ``"<id>#<k>"`` entries, present only for replicas with
memory levels below HBM) counts the prompt's blocks after the HBM prefix that r can restore
from level k (1 host DRAM, 2 SSD, ...): such a hit is priced by its fetch time, not as free.
``hit_cost`` is ``RoutingSettings.level_hit_costs``, by level index (the level registry's costs,
``replica.core.tiers.levels``, unless ``--set <level>_hit_cost=C`` says otherwise).
    load(r) = in_flight_weight * in_flight(r) + queued_tokens(r) / block_size
                (in_flight_weight in blocks of load_block_size tokens where it is set: radix pages)

Read it as a rough time-to-first-token on r: the prefill work already queued ahead of
the request plus the blocks it must compute itself, with each running request charged
``in_flight_weight`` blocks for the decode time it steals.  ``overlap_weight`` > 1 favours
cache hits (better TTFT for long shared prefixes, more skew), < 1 favours balance.
Lowest cost wins; equal costs are broken uniformly at random.

Before the cost is used, SGLang's guard looks at in-flight requests over healthy
replicas: when ``max - min > balance_abs_threshold`` AND ``max > balance_rel_threshold *
min`` (both strict), the cache is ignored and the least-loaded replica is taken, so a
hot prefix cannot pin every request on one replica however large its cache advantage.
"""

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


def is_imbalanced(max_load: float, min_load: float, settings: RoutingSettings) -> bool:
    """SGLang's test; strict on both sides so a threshold value itself does not fire."""
    return (max_load - min_load > settings.balance_abs_threshold
            and max_load > settings.balance_rel_threshold * min_load)


def replica_cost(replica: ReplicaState, cached: int, num_blocks: int, settings: RoutingSettings) -> float:
    """The cost above for one replica; for /cluster views and tests, not the hot loop."""
    return (settings.overlap_weight * (num_blocks - cached)
            + settings.in_flight_cost * replica.in_flight
            + replica.queued_tokens / settings.block_size)


def cache_aware(
    replicas: Sequence[ReplicaState],
    request: RouteRequest,
    overlap: Mapping[str, int],
    settings: RoutingSettings,
    rng: random.Random,
    memory: RouterMemory,
) -> RouteDecision:
    nb = request.num_blocks if request.num_blocks > 0 else 0
    w = settings.overlap_weight
    per_req = settings.in_flight_cost
    inv_bs = 1.0 / settings.block_size
    get = overlap.get
    tiered = len(overlap) > 0 and any("#" in k for k in overlap)
    # the fraction of a block each level's hit saves, with its overlap key's suffix
    saves = [(f"#{k}", 1.0 - cost) for k, cost in enumerate(settings.level_hit_costs, 1)] if tiered else []
    # One pass: cost argmin (reservoir tie-break), in-flight spread, longest overlap.
    best = None
    best_cost = 0.0
    best_ov = max_ov = ties = 0
    lo = hi = 0
    for r in replicas:
        if not r.healthy:
            continue
        f = r.in_flight
        ov = get(r.replica_id, 0)
        ov = 0 if ov <= 0 else (ov if ov < nb else nb)
        todo = float(nb - ov)  # a float from here on (mypyc compiles this loop: shared/compiled_modules.py)
        if tiered:
            rid = r.replica_id
            saved = 0.0  # summed first, in level order: the same rounding as one expression
            for suffix, save in saves:
                saved += save * get(rid + suffix, 0)
            todo -= saved
        cost = w * todo + per_req * f + r.queued_tokens * inv_bs
        if best is None:
            lo = hi = f
        elif f < lo:
            lo = f
        elif f > hi:
            hi = f
        if ov > max_ov:
            max_ov = ov
        if best is None or cost < best_cost:
            best, best_cost, best_ov, ties = r, cost, ov, 1
        elif cost == best_cost:
            ties += 1
            if rng.random() * ties < 1.0:
                best, best_ov = r, ov
    if best is None:
        raise NoHealthyReplica(len(replicas))
    if is_imbalanced(hi, lo, settings):
        pick = least_loaded_pick(replicas, rng)
        return RouteDecision(pick.replica_id, "imbalance_guard", cached_blocks(overlap, pick.replica_id, nb))
    return RouteDecision(best.replica_id, _reason(best_ov, max_ov), best_ov)


def _reason(chosen_overlap: int, longest_overlap: int) -> str:
    """Why the cheapest replica won: no replica held any prefix, it held the longest, or its load
    outweighed a longer prefix elsewhere."""
    if longest_overlap == 0:
        return "cache_miss_balance"
    return "cache_hit" if chosen_overlap == longest_overlap else "load_over_cache"
