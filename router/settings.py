"""One frozen settings object for the router process, validated at start."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

from router.limits import ClientLimits
from router.strategies import RoutingSettings, get_strategy
from shared.auth import check_bind
from shared.errors import InputError
from shared.offload import OffloadSettings
from shared.serve import ConnLimits
from shared.validate import check_positive_int


@dataclass(frozen=True, slots=True)
class RouterSettings:
    replicas: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 8000
    routing: str = "cache_aware"
    index: str = "memory"  # or redis://host:port/db
    cluster: str = "default"
    block_size: int = 16
    routing_settings: RoutingSettings | None = None
    health_interval_s: float = 1.0
    health_timeout_s: float = 1.0
    unhealthy_after: int = 2  # consecutive failed checks (a refused connection counts at once)
    poll_interval_s: float = 0.02  # embedded index: how often replicas' event feeds are read
    index_timeout_s: float = 0.05  # a slower index lookup routes on load alone
    request_timeout_s: float = 600.0
    retries: int = 1  # failed replicas tried per request beyond the first (busy ones do not count)
    busy_backoff_s: float = 0.05  # a replica that answered 503 + Retry-After is skipped this long (doubling)
    hotspot_factor: float = 1.5
    dashboard_interval_s: float = 1.0  # how often the dashboard samples the replicas' /stats
    max_body_bytes: int = 8 * 1024 * 1024
    max_prompt_tokens: int = 1_048_576
    max_output_tokens: int = 65_536
    parse_workers: int = 1  # processes that parse big bodies off the event loop (0 = inline)
    offload_bytes: int = 256 * 1024  # bodies from this size on are parsed in those processes
    large_bodies_per_client: int = 2  # big bodies one client address may have being parsed (429 beyond)
    max_connections: int = 4096  # beyond it a new connection gets a 503 and is closed
    header_timeout_s: float = 10.0  # a request head must arrive within this
    body_timeout_s: float = 30.0  # a request body must arrive within this (408 otherwise)
    write_timeout_s: float = 30.0  # a client that keeps the send buffer full (reads nothing) this long is cut off
    client_max_in_flight: int = 0  # routed requests one client address may have at once (429 beyond); 0 = no limit
    client_rate: float = 0.0  # requests/s one client address may send (token bucket, 429 beyond); 0 = no limit
    client_burst: int = 0  # the bucket's size; 0 = the rate rounded up
    seed: int | None = None
    cluster_token: str | None = None  # sent to replicas' internal endpoints; required beyond loopback

    def __post_init__(self) -> None:
        if not self.replicas:
            raise InputError("replicas", "give at least one replica URL")
        for url in self.replicas:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise InputError("replicas", f"expected http://host:port, got {url!r}")
        if len(set(self.replicas)) != len(self.replicas):
            raise InputError("replicas", "a replica URL is listed twice")
        get_strategy(self.routing)
        if not (0 <= self.port <= 65535):
            raise InputError("port", f"must be 0-65535, got {self.port}")
        if self.index != "memory" and not self.index.startswith(("redis://", "rediss://", "unix://")):
            raise InputError("index", f"expected memory or redis://..., got {self.index!r}")
        for name in ("health_interval_s", "health_timeout_s", "poll_interval_s", "index_timeout_s",
                     "request_timeout_s", "hotspot_factor", "dashboard_interval_s", "busy_backoff_s",
                     "header_timeout_s", "body_timeout_s", "write_timeout_s"):
            if not getattr(self, name) > 0:
                raise InputError(name, f"must be > 0, got {getattr(self, name)}")
        for name in ("block_size", "unhealthy_after", "max_body_bytes", "max_prompt_tokens", "max_output_tokens",
                     "max_connections"):
            check_positive_int(name, getattr(self, name))
        check_bind(self.host, self.cluster_token)
        if not 0 <= self.retries <= 5:
            raise InputError("retries", f"must be 0-5, got {self.retries}")
        if not 0 <= self.parse_workers <= 64:
            raise InputError("parse_workers", f"must be 0-64, got {self.parse_workers}")
        for name in ("offload_bytes", "large_bodies_per_client"):
            if not getattr(self, name) > 0:
                raise InputError(name, f"must be positive, got {getattr(self, name)}")
        self.client_limits()  # checks the client_* fields

    def client_limits(self) -> ClientLimits:
        return ClientLimits(self.client_max_in_flight, self.client_rate, self.client_burst)

    def offload(self) -> OffloadSettings:
        return OffloadSettings(self.parse_workers, self.offload_bytes, self.large_bodies_per_client)

    def conn_limits(self) -> ConnLimits:
        return ConnLimits(self.max_connections, self.header_timeout_s, self.body_timeout_s, self.write_timeout_s)

    def strategy_settings(self) -> RoutingSettings:
        return self.routing_settings or RoutingSettings(block_size=self.block_size)
