"""Inputs, outputs, settings and state shared by every routing strategy.

Strategies are pure functions of these values (plus the caller's ``RoutingContext``: its
``random.Random`` and ``RouterMemory``), so the live aiohttp router and the virtual-time simulator make
identical decisions from identical inputs.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from shared.errors import KvemuError
from shared.validate import check_int, check_number, check_positive_int, check_probability

# Every ``RouteDecision.reason`` is one of these, so metrics can use them as labels.
REASONS: frozenset[str] = frozenset({
    "round_robin",
    "random",
    "least_loaded",
    "cache_hit",           # chosen replica holds the longest cached prefix of any healthy one
    "cache_miss_balance",  # no healthy replica holds any prefix: load decided
    "load_over_cache",     # a longer prefix existed elsewhere, but its load cost more
    "imbalance_guard",     # in-flight spread crossed both balance thresholds: least-loaded
    "session_new",         # first sight of the session: its ring owner accepted it
    "session_sticky",      # the session's replica is healthy and within the load bound
    "session_overflow",    # its preferred replica was over the load bound: walked the ring
    "session_failover",    # its preferred replica is unhealthy or gone: walked the ring
    "no_session",          # session strategy without a session id: least-loaded
    "no_healthy_replica",  # label for callers' metrics when NoHealthyReplica is raised
    "only_replica",        # one replica, nothing to choose: RoutingStep.only, no strategy asked
})


class NoHealthyReplica(KvemuError):
    """No replica may take the request: every one is unhealthy, or there are none."""

    reason = "no_healthy_replica"

    def __init__(self, total: int):
        self.total = total
        super().__init__(f"no healthy replica among {total} known")


@dataclass(slots=True)
class ReplicaState:
    """One replica as the router sees it at decision time.

    Mutable on purpose: the simulator keeps one instance per replica and bumps the
    counters in place instead of allocating a fresh view per decision.  Strategies
    only read it.  ``in_flight`` must already include requests routed to this
    replica but not yet acknowledged (count at decision time, not after dispatch),
    or bursts all land on the same replica before its counter moves.
    """

    replica_id: str
    in_flight: int = 0  # requests running or waiting on the replica
    queued_tokens: int = 0  # prompt tokens routed there and not yet prefilled
    kv_usage: float = 0.0  # fraction of KV blocks in use, [0, 1]
    healthy: bool = True
    capacity_blocks: int = 0  # 0 = unknown


class RouteRequest(NamedTuple):
    session: str | None = None
    num_blocks: int = 0  # full blocks in the prompt (the partial tail is never cached)
    input_tokens: int = 0


class RouteDecision(NamedTuple):
    replica_id: str
    reason: str  # one of REASONS
    predicted_cached_blocks: int  # the index's overlap for the chosen replica


@dataclass(frozen=True, slots=True)
class RoutingSettings:
    """Every threshold and factor any strategy reads.

    Units: ``cache_aware`` cost is in *blocks of prefill work* (see prefix.py);
    the imbalance guard and the bounded-load rule count *in-flight requests*.
    """

    # Tokens per KV block; converts queued_tokens to blocks in the cache_aware load term.
    block_size: int = 16
    # Dynamo's overlap weight: cost of one block to prefill relative to one block of load.
    # 0 ignores the cache (pure load balancing); larger values favour cache hits.
    overlap_weight: float = 1.0
    # Blocks of load charged per in-flight request, on top of its queued tokens.
    in_flight_weight: float = 1.0
    # Tokens of the block in_flight_weight counts (0: block_size). Radix pages set 16, vLLM's block, so
    # that pages of 1 do not make an in-flight request weigh 16x less than blocks of 16 do
    # (kvemu.options.router_flags.routing_settings).
    load_block_size: int = 0
    # SGLang's imbalance guard (its current defaults): least-loaded routing when
    # max - min > abs AND max > rel * min, over in-flight requests of healthy replicas.
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    # Mirrokni et al.: a replica may take a session request while in_flight < ceil(c * avg),
    # avg counting the request being placed.  c >= 1 guarantees some replica qualifies.
    bounded_load_factor: float = 1.25
    # Requests a replica may always hold before the bound applies (affinity wins at low load).
    bounded_load_min: int = 2
    # Points per replica on the session hash ring; more points, smoother spread.
    virtual_nodes: int = 100
    # Bound on remembered session -> replica assignments (LRU beyond it).
    max_sessions: int = 100_000
    # A prefix block a replica holds in memory level k below HBM (1 host DRAM, 2 SSD, ...) costs
    # level_hit_costs[k - 1] of computing it (its fetch time over its recompute time; 0 = free like an
    # HBM hit, 1 = as a miss); a level beyond the list costs as a miss. The overlap map reports such
    # blocks under "<replica id>#<level>" (shared.index.base.level_key). The values are the level
    # registry's (replica.core.tiers.levels: each kind's hit_cost), which the strategies do not import:
    # every command builds these settings with kvemu.options.router_flags.routing_settings, the
    # simulator from its own level list; () here (nothing known of the levels) prices them as misses.
    level_hit_costs: tuple[float, ...] = ()

    @property
    def in_flight_cost(self) -> float:
        """What one in-flight request adds to a replica's load, in blocks of ``block_size`` tokens."""
        if self.load_block_size:
            return self.in_flight_weight * self.load_block_size / self.block_size
        return self.in_flight_weight

    def __post_init__(self) -> None:
        check_positive_int("block_size", self.block_size)
        check_int("load_block_size", self.load_block_size, 0)
        check_number("overlap_weight", self.overlap_weight, 0.0)
        check_number("in_flight_weight", self.in_flight_weight, 0.0)
        check_int("balance_abs_threshold", self.balance_abs_threshold, 0)
        check_positive_int("bounded_load_min", self.bounded_load_min)
        check_number("balance_rel_threshold", self.balance_rel_threshold, 1.0)
        check_number("bounded_load_factor", self.bounded_load_factor, 1.0)
        check_int("virtual_nodes", self.virtual_nodes, 1, 10_000)
        check_positive_int("max_sessions", self.max_sessions)
        for k, cost in enumerate(self.level_hit_costs, 1):
            check_probability(f"level_hit_costs[level {k}]", cost)


@dataclass(slots=True)
class RouterMemory:
    """The little state strategies keep between decisions; one per router.

    Not thread-safe: the live router calls strategies from its single event loop.
    """

    rr_next: int = 0
    # session id -> replica id, least recently used first; bounded by settings.max_sessions.
    sessions: OrderedDict[str, str] = field(default_factory=OrderedDict)
    # Hash ring cache, rebuilt only when the replica list (ids, order) or vnode count changes.
    ring_key: tuple = ()
    ring_points: list[int] = field(default_factory=list)
    ring_owners: list[int] = field(default_factory=list)  # index into the replica list


@dataclass(frozen=True, slots=True)
class RoutingContext:
    """What a strategy reads besides the replicas and the request: one router's settings, the random
    source that breaks its ties, and its memory. One per router (``RoutingStep`` builds it), the same
    objects on every decision."""

    settings: RoutingSettings
    rng: random.Random
    memory: RouterMemory


Strategy = Callable[[Sequence[ReplicaState], RouteRequest, Mapping[str, int], RoutingContext], RouteDecision]


def cached_blocks(overlap: Mapping[str, int], replica_id: str, num_blocks: int) -> int:
    """The index's overlap for one replica, clamped to the prompt's full blocks."""
    ov = overlap.get(replica_id, 0)
    if ov <= 0:
        return 0
    return ov if ov < num_blocks else max(num_blocks, 0)


def decide(replica: ReplicaState, reason: str, overlap: Mapping[str, int], num_blocks: int) -> RouteDecision:
    """Send the request to ``replica`` for ``reason``, with the index's overlap there clamped to the prompt."""
    return RouteDecision(replica.replica_id, reason, cached_blocks(overlap, replica.replica_id, num_blocks))


def least_loaded_pick(replicas: Sequence[ReplicaState], rng: random.Random) -> ReplicaState:
    """Healthy replica with the fewest in-flight requests, then fewest queued tokens.

    Ties are broken uniformly at random by reservoir sampling (replace the k-th tied
    candidate with probability 1/k): choosing by list order would pile every tie onto
    the first replica, the hotspot bug real routers shipped.
    """
    best = None
    best_f = best_q = 0
    ties = 0
    for r in replicas:
        if not r.healthy:
            continue
        f = r.in_flight
        q = r.queued_tokens
        if best is None or f < best_f or (f == best_f and q < best_q):
            best, best_f, best_q, ties = r, f, q, 1
        elif f == best_f and q == best_q:
            ties += 1
            if rng.random() * ties < 1.0:
                best = r
    if best is None:
        raise NoHealthyReplica(len(replicas))
    return best
