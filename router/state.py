"""What one router process owns (``RouterState``) and the typed keys its app stores it under."""

from __future__ import annotations

import time

import aiohttp
from aiohttp import web

from router.cluster import Cluster
from router.limits import ClientLimiter
from router.metrics import RouterMetrics
from router.session_flights import SessionFlights
from router.settings import RouterSettings
from router.strategies import RoutingStep, strategy_spec
from shared.index import make_index


class RouterState:
    def __init__(self, settings: RouterSettings) -> None:
        self.settings = settings
        self.metrics = RouterMetrics()
        self.index = make_index(settings.index if settings.index == "memory"
                                else _with_cluster(settings.index, settings.cluster))
        self.embedded = settings.index == "memory"
        self.cluster = Cluster(settings, self.index, self.metrics)
        self.metrics.cluster = self.cluster
        self.router = RoutingStep(strategy_spec(settings.routing), settings.strategy_settings(), settings.seed)
        # P/D: the prefill pool's own step (its round-robin turn, sessions and decision counts apart from the
        # decode pool's, which ``router`` routes); unused in a colocated cluster
        self.prefill_router = RoutingStep(strategy_spec(settings.prefill_routing or settings.routing),
                                          settings.strategy_settings(),
                                          None if settings.seed is None else settings.seed + 1)
        self.started = time.time()
        self.request_timeout = aiohttp.ClientTimeout(total=settings.request_timeout_s)  # one, not one per request
        limits = settings.client_limits()
        self.limiter = ClientLimiter(limits) if limits.enabled else None  # None: no per-client limit, no cost
        self.sessions = SessionFlights()  # requests in flight per session: an agent's fan-out (the dashboard's)


def _with_cluster(url: str, cluster: str) -> str:
    if "cluster=" in url:
        return url
    return url + ("&" if "?" in url else "?") + f"cluster={cluster}"


SETTINGS = web.AppKey("settings", RouterSettings)
ROUTER = web.AppKey("router", RouterState)
