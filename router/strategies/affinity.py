"""Session affinity: consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam).

Each replica owns ``virtual_nodes`` points on a 64-bit ring (xxh3 of its id and the point
number, so every process and host builds the same ring; Python's salted ``hash()`` would
not).  A session id hashes to a ring position; its request goes to the first replica
clockwise that is healthy and *within bound*::

    bound = ceil(bounded_load_factor * (total_in_flight + 1) / healthy_replicas)
    within bound  <=>  in_flight < bound

The ``+ 1`` counts the request being placed, so after placement no replica exceeds
``ceil(c * average)``, and with c >= 1 some replica is always within bound (they cannot
all hold at least the average).

Sessions are sticky: the replica a session last went to holds its KV history, so it
keeps the session while healthy and within bound, even if the ring would now say
otherwise (a replica joined).  When it is not, the ring walk picks a new one and the
assignment moves there, because that replica now holds the freshest full prefix.  The
assignment map is an LRU bounded by ``max_sessions``; a forgotten session simply
re-enters through the ring, usually landing where it was.  A huge factor disables the
bound and reproduces plain affinity, hotspots included.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Mapping, Sequence

import xxhash

from router.strategies.base import (
    NoHealthyReplica,
    ReplicaState,
    RouteDecision,
    RouteRequest,
    RouterMemory,
    RoutingContext,
    decide,
    least_loaded_pick,
)

_xxh3 = xxhash.xxh3_64_intdigest
# Guards ceil() against float error pushing an exact integer (1.25 * 8 / 2) just above it.
_EPS = 1e-9


def session_point(session: str) -> int:
    """Ring position of a session id; stable across processes and hosts."""
    return _xxh3(b"session\x1f" + session.encode("utf-8", "surrogatepass"))


def replica_points(replica_id: str, virtual_nodes: int) -> list[int]:
    """Ring positions owned by one replica; stable across processes and hosts."""
    base = b"replica\x1f" + replica_id.encode("utf-8", "surrogatepass") + b"\x1f"
    return [_xxh3(base + str(i).encode()) for i in range(virtual_nodes)]


def _ensure_ring(memory: RouterMemory, replicas: Sequence[ReplicaState], virtual_nodes: int) -> None:
    # The ring itself depends only on the set of ids; it is re-keyed on list order too
    # because ring_owners holds list indices, which keeps the walk free of dict lookups.
    key = (virtual_nodes, *(r.replica_id for r in replicas))
    if key == memory.ring_key:
        return
    index = {r.replica_id: i for i, r in enumerate(replicas)}
    pairs = sorted((p, replica_id) for replica_id in index for p in replica_points(replica_id, virtual_nodes))
    memory.ring_points = [p for p, _ in pairs]
    memory.ring_owners = [index[replica_id] for _, replica_id in pairs]
    memory.ring_key = key


def load_bound(total_in_flight: int, healthy: int, factor: float) -> int:
    """Most in-flight requests a replica may hold after taking one more request."""
    return math.ceil(factor * (total_in_flight + 1) / healthy - _EPS)


def _walk(memory: RouterMemory, replicas: Sequence[ReplicaState], point: int, bound: int):
    """First replica clockwise from ``point`` that is healthy and below ``bound``.

    Also returns the first owner met (the ring's preferred replica for this point).
    """
    points, owners = memory.ring_points, memory.ring_owners
    n = len(points)
    start = bisect_right(points, point)
    first = None
    for step in range(n):
        r = replicas[owners[(start + step) % n]]
        if first is None:
            first = r
        if r.healthy and r.in_flight < bound:
            return r, first
    raise AssertionError("unreachable: with factor >= 1 some healthy replica is below the bound")


def _remember(memory: RouterMemory, session: str, replica_id: str, max_sessions: int) -> None:
    sessions = memory.sessions
    sessions[session] = replica_id
    sessions.move_to_end(session)
    while len(sessions) > max_sessions:
        sessions.popitem(last=False)


def session_affinity(replicas: Sequence[ReplicaState], request: RouteRequest, overlap: Mapping[str, int],
                     ctx: RoutingContext) -> RouteDecision:
    """Sticky, bounded-load consistent hashing of ``request.session`` (module docstring)."""
    sid = request.session
    nb = request.num_blocks
    if not sid:
        return decide(least_loaded_pick(replicas, ctx.rng), "no_session", overlap, nb)
    settings, memory = ctx.settings, ctx.memory
    assigned_id = memory.sessions.get(sid)
    assigned = None
    total = healthy = 0
    for r in replicas:
        if r.healthy:
            healthy += 1
            total += r.in_flight
        if r.replica_id == assigned_id:
            assigned = r
    if not healthy:
        raise NoHealthyReplica(len(replicas))
    # A floor keeps low load from counting a replica with one request as full (which would
    # move sessions, and their caches, for nothing); it never lets load exceed the floor.
    bound = max(load_bound(total, healthy, settings.bounded_load_factor), settings.bounded_load_min)
    if assigned is not None and assigned.healthy and assigned.in_flight < bound:
        memory.sessions.move_to_end(sid)
        return decide(assigned, "session_sticky", overlap, nb)
    _ensure_ring(memory, replicas, settings.virtual_nodes)
    chosen, first = _walk(memory, replicas, session_point(sid), bound)
    preferred = first if assigned_id is None else assigned
    if preferred is chosen:
        reason = "session_new"
    elif preferred is None or not preferred.healthy:
        reason = "session_failover"
    else:
        reason = "session_overflow"
    _remember(memory, sid, chosen.replica_id, settings.max_sessions)
    return decide(chosen, reason, overlap, nb)
