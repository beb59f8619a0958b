"""One frozen settings object for the router process, validated at start."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from router.limits import ClientLimits
from router.strategies import DEFAULT_STRATEGY, RoutingSettings, get_strategy
from shared.errors import InputError
from shared.serving import ServingSettings
from shared.validate import check_positive_int

if TYPE_CHECKING:
    from replica.core.disagg import PdSettings  # the decider kvemu builds and hands in (router.pd_legs)

ROLES = ("both", "prefill", "decode")  # replica.core.disagg.ROLES, which the router process does not import


@dataclass(frozen=True, slots=True)
class RouterSettings:
    replicas: tuple[str, ...]
    port: int = 8000
    routing: str = DEFAULT_STRATEGY
    index: str = "memory"  # or redis://host:port/db
    cluster: str = "default"
    block_size: int = 16  # the replicas' hashing unit: a block, or a radix page (matching)
    matching: str = "blocks"  # what the replicas match by: "blocks" or "radix" (kvemu.options.matching)
    routing_settings: RoutingSettings | None = None
    health_interval_s: float = 1.0
    health_timeout_s: float = 1.0
    unhealthy_after: int = 2  # consecutive failed checks (a refused connection counts at once)
    poll_interval_s: float = 0.02  # embedded index: how often replicas' event feeds are read
    index_timeout_s: float = 0.05  # a slower index lookup routes on load alone
    request_timeout_s: float = 600.0  # the most a request may take on one replica, whatever it answers meanwhile
    # after this long without the answer starting (a stream's first token; a non-streamed answer, which a replica
    # sends whole once done) or without a stream's next bytes, the replica is asked whether it is alive: one that
    # does not answer /health is given up (a non-streamed request is retried elsewhere), one that does is waited
    # for again (router.upstream.Watch). A frozen replica holds a request this long plus a health timeout or two
    upstream_first_byte_timeout_s: float = 5.0
    retries: int = 1  # failed replicas tried per request beyond the first (busy ones do not count)
    busy_backoff_s: float = 0.05  # a replica that answered 503 + Retry-After is skipped this long (doubling)
    hotspot_factor: float = 1.5
    dashboard_interval_s: float = 1.0  # how often the dashboard samples the replicas' /stats
    # binding, body limits, connection caps, timeouts and the cluster token (sent to replicas'
    # internal endpoints), as the replicas have them
    serving: ServingSettings = ServingSettings()
    client_max_in_flight: int = 0  # routed requests one client address may have at once (429 beyond); 0 = no limit
    client_rate: float = 0.0  # requests/s one client address may send (token bucket, 429 beyond); 0 = no limit
    client_burst: int = 0  # the bucket's size; 0 = the rate rounded up
    seed: int | None = None
    # P/D (router/pd_legs.py): each replica URL's role as the command line gave it ("" or no entry: the role the
    # replica reports on /health), and the decider (replica.core.disagg.PdSettings, from kvemu.options.disagg;
    # None: every request a P/D cluster takes goes through a remote prefill)
    roles: tuple[str, ...] = ()
    pd: PdSettings | Any = None
    prefill_routing: str | None = None  # the prefill pool's strategy (None: ``routing``)
    # Shared KV stores (`kvemu store`): each one's URL and the replica ids it serves (none: every replica),
    # and the shared level's index in the replicas' stacks (the last level: 3 after host DRAM and SSD; kvemu's
    # front end takes it from the same level list its routing settings price; 0 without a store)
    shared_stores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    shared_level: int = 0

    def __post_init__(self) -> None:
        if not self.replicas:
            raise InputError("replicas", "give at least one replica URL")
        for url in self.replicas:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise InputError("replicas", f"expected http://host:port, got {url!r}")
        if len(self.roles) > len(self.replicas) or any(r and r not in ROLES for r in self.roles):
            raise InputError("replicas", f"a role is one of {', '.join(ROLES)} before a replica URL (role=URL),"
                                         f" got {', '.join(r for r in self.roles if r not in ROLES) or 'too many'}")
        if len(set(self.replicas)) != len(self.replicas):
            raise InputError("replicas", "a replica URL is listed twice")
        get_strategy(self.routing)
        if self.prefill_routing is not None:
            get_strategy(self.prefill_routing)
        if not (0 <= self.port <= 65535):
            raise InputError("port", f"must be 0-65535, got {self.port}")
        if self.index != "memory" and not self.index.startswith(("redis://", "rediss://", "unix://")):
            raise InputError("index", f"expected memory or redis://..., got {self.index!r}")
        for name in ("health_interval_s", "health_timeout_s", "poll_interval_s", "index_timeout_s",
                     "request_timeout_s", "upstream_first_byte_timeout_s", "hotspot_factor", "dashboard_interval_s", "busy_backoff_s"):
            if not getattr(self, name) > 0:
                raise InputError(name, f"must be > 0, got {getattr(self, name)}")
        if self.matching not in ("blocks", "radix"):
            raise InputError("matching", f"must be blocks or radix, got {self.matching!r}")
        for name in ("block_size", "unhealthy_after"):
            check_positive_int(name, getattr(self, name))
        if not 0 <= self.retries <= 5:
            raise InputError("retries", f"must be 0-5, got {self.retries}")
        self.client_limits()  # checks the client_* fields
        urls = [url for url, _ in self.shared_stores]
        for url in urls:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise InputError("shared_stores", f"expected a store's http://host:port, got {url!r}")
        if len(set(urls)) != len(urls):
            raise InputError("shared_stores", "a store URL is listed twice")
        served = [rid for _, ids in self.shared_stores for rid in ids]
        if len(set(served)) != len(served):
            raise InputError("shared_stores", "a replica is served by two stores (each belongs to one scope group)")
        if self.shared_stores and not 1 <= self.shared_level <= 15:
            raise InputError("shared_level", f"the shared level's index must be 1-15, got {self.shared_level}")

    def role_of(self, i: int) -> str:
        """The role the command line gave replica ``i`` ("": none, its /health says)."""
        return self.roles[i] if i < len(self.roles) else ""

    def client_limits(self) -> ClientLimits:
        return ClientLimits(self.client_max_in_flight, self.client_rate, self.client_burst)

    def strategy_settings(self) -> RoutingSettings:
        """The strategies' settings: kvemu/router_cmd.py builds them with each memory level's hit cost from the
        level registry (kvemu.options.router_flags.routing_settings); without them, levels cost as misses."""
        return self.routing_settings or RoutingSettings(block_size=self.block_size)
