"""Per-client limits on routed requests: requests in flight and a request rate.

A client is its address (``request.remote``). Both limits are off by default (0), so
benchmarks and tests see no difference; an operator turns them on with
``--client-max-in-flight N`` (at most N routed requests of one client at once) and
``--client-rate R`` (R requests/s on average, in bursts of up to ``--client-burst B``: a
token bucket). Beyond either the router answers 429 naming the limit, with Retry-After,
before it reads the body. Each router process keeps its own counts (with ``--workers N`` a
client may get up to N times the limits, one per worker its connections land on).

The bucket table is bounded: past ``max_clients`` entries, buckets that have refilled
(their clients are idle) are dropped, so a scan of many addresses cannot grow it forever.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from shared.errors import InputError


@dataclass(frozen=True, slots=True)
class ClientLimits:
    max_in_flight: int = 0  # routed requests one client may have at once; 0 = no limit
    rate: float = 0.0  # requests/s one client may send on average; 0 = no limit
    burst: int = 0  # requests one client may send at once under ``rate``; 0 = max(1, ceil(rate))
    max_clients: int = 65_536  # bucket entries kept before idle ones are dropped

    def __post_init__(self) -> None:
        if isinstance(self.max_in_flight, bool) or not isinstance(self.max_in_flight, int) or self.max_in_flight < 0:
            raise InputError("client_max_in_flight", f"must be 0 (no limit) or a positive integer, got"
                                                     f" {self.max_in_flight!r}")
        if not 0 <= self.rate < math.inf:
            raise InputError("client_rate", f"must be 0 (no limit) or a positive number of requests/s, got"
                                            f" {self.rate!r}")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 0:
            raise InputError("client_burst", f"must be 0 (the rate rounded up) or a positive integer, got"
                                             f" {self.burst!r}")

    @property
    def enabled(self) -> bool:
        return self.max_in_flight > 0 or self.rate > 0

    @property
    def bucket_size(self) -> int:
        return self.burst or max(1, math.ceil(self.rate))


class Refusal:
    """Why a client was refused: the setting it hit, a message naming it, and when to retry."""

    __slots__ = ("field", "message", "retry_after_s")

    def __init__(self, field: str, message: str, retry_after_s: float) -> None:
        self.field, self.message, self.retry_after_s = field, message, retry_after_s


class ClientLimiter:
    def __init__(self, limits: ClientLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits
        self.clock = clock
        self.in_flight: dict[str, int] = {}
        self.buckets: dict[str, list[float]] = {}  # client -> [tokens left, when last filled]

    def admit(self, client: str) -> Refusal | None:
        """None when the request may go ahead (then call ``release`` when it is done)."""
        lim = self.limits
        held = self.in_flight.get(client, 0)
        if lim.max_in_flight and held >= lim.max_in_flight:
            return Refusal("client_max_in_flight", f"this client already has {held} requests in flight; the limit"
                                                   f" is {lim.max_in_flight} per client", 1.0)
        if lim.rate:
            wait = self._take(client)
            if wait:
                return Refusal("client_rate", f"this client is over {lim.rate:g} requests/s (bursts of"
                                              f" {lim.bucket_size}); retry in {wait:.2f} s", wait)
        self.in_flight[client] = held + 1
        return None

    def release(self, client: str) -> None:
        left = self.in_flight[client] - 1
        if left:
            self.in_flight[client] = left
        else:
            del self.in_flight[client]

    def _take(self, client: str) -> float:
        """Take a token from the client's bucket: 0.0, or the seconds until one is there."""
        now, lim = self.clock(), self.limits
        size = lim.bucket_size
        bucket = self.buckets.get(client)
        if bucket is None:
            if len(self.buckets) >= lim.max_clients:
                self._drop_idle(now)
            bucket = self.buckets[client] = [float(size), now]
        tokens = min(size, bucket[0] + (now - bucket[1]) * lim.rate)
        bucket[1] = now
        if tokens >= 1.0:
            bucket[0] = tokens - 1.0
            return 0.0
        bucket[0] = tokens
        return (1.0 - tokens) / lim.rate

    def _drop_idle(self, now: float) -> None:
        lim = self.limits
        full = [c for c, (tokens, at) in self.buckets.items() if tokens + (now - at) * lim.rate >= lim.bucket_size]
        for c in full:
            del self.buckets[c]
        if len(self.buckets) >= lim.max_clients:  # every one is busy: forget the oldest half
            for c in sorted(self.buckets, key=lambda c: self.buckets[c][1])[:len(self.buckets) // 2]:
                del self.buckets[c]
