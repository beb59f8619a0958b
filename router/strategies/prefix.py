"""Cache-aware routing: Dynamo's cost function, with SGLang's imbalance guard weighed in prefill work.

Cost of sending the request to healthy replica r, in **blocks of prefill work**::

    cost(r) = overlap_weight * blocks_to_prefill(r) + load(r)
    blocks_to_prefill(r) = num_blocks - overlap[r]          (overlap clamped to [0, num_blocks])
                           - sum over levels k >= 1 of (1 - hit_cost[k]) * lower[r][k]
    load(r) = queued_tokens(r) / block_size + in_flight_weight * in_flight(r)
                (in_flight_weight in blocks of load_block_size tokens where it is set: radix pages)

``lower[r][k]`` (the overlap map's ``"<id>#<k>"`` entries, present only for replicas with
memory levels below HBM) counts the prompt's blocks after the HBM prefix that r can restore
from level k (1 host DRAM, 2 SSD, ...): such a hit is priced by its fetch time, not as free.
``hit_cost`` is ``RoutingSettings.level_hit_costs``, by level index (the level registry's costs,
``replica.core.tiers.levels``, unless ``--set <level>_hit_cost=C`` says otherwise).

Read it as a rough time to first token on r, priced as the replicas' own steps price work
(shared/costmodel.py): past the step's fixed floor (the weights' read), a step's time grows with the
tokens of its prefill chunks, so a block queued ahead and a block of the request's own prefill cost
about the same, and a cached block saves one. ``overlap_weight`` > 1 favours cache hits (better TTFT
for long shared prefixes, more skew), < 1 favours balance. Lowest cost wins; equal costs are broken
uniformly at random.

Dynamo's KV router prices a worker as ``overlap_score_weight * prefill_blocks + decode_blocks``:
its prefill blocks are the prompts routed there less their cached prefix, counted from routing until
the first token (``mark_prefill_completed``), its decode blocks the active sequences' KV.
``queued_tokens(r)`` is that prefill count (router/strategies/step.py; the live router learns the first
token from the replica's answer head, the simulator from its step, so both count alike). It used to be
the whole prompt of every request in flight until its answer ended, so each decoding request weighed
its full prompt: on the README tour's replay the live router sent 57 of 122 later turns away from their
session's replica (``load_over_cache``) for a balance that bought no TTFT, token hit ratio 0.40 against
session affinity's 0.60; counted until the first token, none leave and it hits 0.654, its ceiling. For
decode load the in-flight term stands in for Dynamo's decode blocks: in a mixed step a decoder adds one
token's products, its KV read and a per-sequence cost, about 0.2 of a 16-token block on
qwen3-coder-30b-a3b / H200 with a 2k-token context and a 512-token chunk (2-3 blocks at 20k tokens), so
``in_flight_weight`` (1 block a request) prices it from above without knowing the model: a prefix hit of
more blocks than the replicas' in-flight spread wins where nothing queues.

The imbalance guard is SGLang's test on in-flight requests over healthy replicas: ``max - min >
balance_abs_threshold`` AND ``max > balance_rel_threshold * min`` (both strict). SGLang then ignores
the cache and takes the least-loaded replica (its cost has no load term: the guard is its only
balance). Here the guard takes the least-loaded replica only when the cheapest replica's queued
prefill is more than the prefill its hit saves over that replica, ``queued_tokens(best) /
block_size > overlap_weight * (blocks_to_prefill(least) - blocks_to_prefill(best))``, and otherwise
leaves the cheapest: decoders barely slow a prefill, so an in-flight spread alone never gives a hit
away. As the cost already weighs the queue, the guard now fires only where the least-loaded replica
queues too; it then trades some TTFT for the in-flight spread SGLang bounds. A hot prefix still spreads,
through the cost's in-flight term, once the spread exceeds its hit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from router.strategies.base import (
    NoHealthyReplica,
    ReplicaState,
    RouteDecision,
    RouteRequest,
    RoutingContext,
    RoutingSettings,
    decide,
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


def cache_aware(replicas: Sequence[ReplicaState], request: RouteRequest, overlap: Mapping[str, int],
                ctx: RoutingContext) -> RouteDecision:
    settings, rng = ctx.settings, ctx.rng
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
    best_cost = best_todo = 0.0
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
            best, best_cost, best_todo, best_ov, ties = r, cost, todo, ov, 1
        elif cost == best_cost:
            ties += 1
            if rng.random() * ties < 1.0:
                best, best_todo, best_ov = r, todo, ov
    if best is None:
        raise NoHealthyReplica(len(replicas))
    if is_imbalanced(hi, lo, settings):
        pick = least_loaded_pick(replicas, rng)
        if pick is not best and best.queued_tokens * inv_bs > w * (_to_prefill(pick.replica_id, nb, overlap, saves)
                                                                   - best_todo):
            return decide(pick, "imbalance_guard", overlap, nb)
    return RouteDecision(best.replica_id, _reason(best_ov, max_ov), best_ov)


def _to_prefill(replica_id: str, nb: int, overlap: Mapping[str, int], saves: list[tuple[str, float]]) -> float:
    """``blocks_to_prefill`` of one replica, as the loop above computes it (the same order of sums)."""
    ov = overlap.get(replica_id, 0)
    ov = 0 if ov <= 0 else (ov if ov < nb else nb)
    todo = float(nb - ov)
    saved = 0.0
    for suffix, save in saves:
        saved += save * overlap.get(replica_id + suffix, 0)
    return todo - saved


def _reason(chosen_overlap: int, longest_overlap: int) -> str:
    """Why the cheapest replica won: no replica held any prefix, it held the longest, or its load
    outweighed a longer prefix elsewhere."""
    if longest_overlap == 0:
        return "cache_miss_balance"
    return "cache_hit" if chosen_overlap == longest_overlap else "load_over_cache"
