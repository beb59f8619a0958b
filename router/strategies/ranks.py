"""Data-parallel ranks in the index's overlap: a replica's ranks each hold their own blocks (the index keys them
``"<id>/dp<rank>"``, ``shared.index.base.dp_rank_key``), and a router picks (replica, rank) as Dynamo's KV router
picks (worker, dp_rank): the strategies weigh each replica by its best rank's prefix, and the request goes to that
rank (vLLM's ``X-data-parallel-rank``), unless the decision counted on no prefix: the replica then balances its ranks
itself (vLLM's waiting x 4 + running, ``replica.core.dp.pick_rank``). Where every prompt shares a prefix (a system
prompt) the first rank to cache it would take every request; so, as the cache_aware strategy guards replicas
(router/strategies/prefix.py), SGLang's imbalance test guards a replica's ranks: over the requests the router has
in flight on each rank it named, a spread past both thresholds sends the request to the least-loaded rank instead.
Pure, for the live router and the simulator alike: one rule, ``fold_ranks`` then ``chosen_rank``."""

from __future__ import annotations

from collections.abc import Mapping

from router.strategies.base import RoutingSettings
from router.strategies.prefix import is_imbalanced
from shared.index.base import split_dp_rank


def fold_ranks(overlap: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """``overlap`` with each replica's ranks folded into the replica: its HBM prefix the longest of its ranks', each
    lower level's run (``"<id>#<level>"``) that same rank's; and per replica the rank holding that prefix (ties to
    the lowest rank). Keys that name no rank pass unchanged."""
    best: dict[str, tuple[int, int]] = {}  # replica -> (blocks, rank)
    out: dict[str, int] = {}
    for key, n in overlap.items():
        head, sep, _ = key.partition("#")
        replica, rank = split_dp_rank(head)
        if rank is None:
            if not sep:
                out[key] = n
            continue
        n = 0 if sep else n  # a rank with lower levels only: no HBM prefix
        if replica not in best or (n, -rank) > (best[replica][0], -best[replica][1]):
            best[replica] = (n, rank)
    ranks = {replica: rank for replica, (_, rank) in best.items()}
    for replica, (n, _) in best.items():
        out[replica] = n
    for key, n in overlap.items():
        head, sep, level = key.partition("#")
        if not sep:
            continue
        replica, rank = split_dp_rank(head)
        if rank is None:
            out[key] = n
        elif ranks.get(replica) == rank:
            out[f"{replica}#{level}"] = n
    return out, ranks


def chosen_rank(ranks: Mapping[str, int], replica_id: str, predicted_cached_blocks: int,
                rank_in_flight: Mapping[int, int], settings: RoutingSettings) -> int | None:
    """The rank a request routed to ``replica_id`` goes to: the one holding the prefix its decision counted on
    (``fold_ranks``' ranks), unless the requests the router has in flight on the replica's ranks
    (``rank_in_flight``, every rank) are imbalanced (``is_imbalanced``: the balance thresholds of ``settings``):
    then the least loaded, ties to the lowest. None where the decision counted on no prefix (the replica's ranks
    balance it)."""
    rank = ranks.get(replica_id) if predicted_cached_blocks > 0 else None
    if rank is None or not rank_in_flight:
        return rank
    loads = rank_in_flight.values()
    if is_imbalanced(max(loads), min(loads), settings):
        return min(rank_in_flight, key=lambda r: (rank_in_flight[r], r))
    return rank
