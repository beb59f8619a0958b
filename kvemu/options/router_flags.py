"""The router's own flags: its routing strategy and settings, how often it samples its replicas
(health, dashboard) and the per-client limits (router/limits.py, off by default), for `kvemu router`
and `kvemu up`. Their defaults are ``RouterSettings``'s own, read from the dataclass."""

from __future__ import annotations

from dataclasses import fields

from kvemu.options.option import Option
from router.settings import RouterSettings
from router.strategies import SPECS

_ROUTER = {f.name: f.default for f in fields(RouterSettings)}
ROUTING = Option("--routing", _ROUTER["routing"], help=f"routing strategy: {', '.join(SPECS)} (default {_ROUTER['routing']})")
SET = Option("--set", (), metavar="NAME=VALUE", repeat=True,
             help="routing setting, e.g. bounded_load_factor=1.25, balance_abs_threshold=64 (once per setting)")
ROUTING_OPTIONS = (ROUTING, SET)
ROUTER_OPTIONS = (
    Option("--health-interval", _ROUTER["health_interval_s"], type=float, help="seconds between replica health checks"),
    Option("--dashboard-interval", _ROUTER["dashboard_interval_s"], type=float,
           help="seconds between the samples /dashboard draws (each reads every replica's /stats)"),
    Option("--client-max-in-flight", _ROUTER["client_max_in_flight"], type=int,
           help="routed requests one client address may have at once; 429 beyond (default 0: no limit)"),
    Option("--client-rate", _ROUTER["client_rate"], type=float,
           help="requests/s one client address may send on average; 429 beyond (default 0: no limit)"),
    Option("--client-burst", _ROUTER["client_burst"], type=int,
           help="requests one client may send at once under --client-rate (default: the rate rounded up)"),
)

