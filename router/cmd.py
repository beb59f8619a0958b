"""``kvemu router`` / ``python -m router``: the cache-aware router process."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from shared.cli import serve
from shared.overrides import apply_overrides, parse_pairs


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    p.add_argument("--replicas", required=True, help="comma-separated replica URLs")
    p.add_argument("--routing", default="cache_aware")
    p.add_argument("--index", default="memory", help="memory (embedded) or redis://host:port/db")
    p.add_argument("--cluster", default="default", help="namespace of the Redis index keys")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="routing setting, e.g. bounded_load_factor=1.25, balance_abs_threshold=64")
    p.add_argument("--health-interval", type=float, default=1.0)
    p.add_argument("--dashboard-interval", type=float, default=1.0,
                   help="seconds between the samples /dashboard draws (each reads every replica's /stats)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--log-level", default="warning")


def settings_from_args(args):
    from router.settings import RouterSettings
    from router.strategies import RoutingSettings

    routing = apply_overrides(RoutingSettings(block_size=args.block_size), parse_pairs(args.set))
    replicas = tuple(u.strip() for u in args.replicas.split(",") if u.strip())
    return RouterSettings(replicas=replicas, host=args.host, port=args.port, routing=args.routing, index=args.index,
                          cluster=args.cluster, block_size=args.block_size, routing_settings=routing,
                          health_interval_s=args.health_interval, dashboard_interval_s=args.dashboard_interval,
                          seed=args.seed)


def run(args) -> int:
    from aiohttp import web

    from router.app import make_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = settings_from_args(args)
    app = make_app(settings)
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:  # pragma: no cover
        pass

    def started(_message: str) -> None:  # after the socket is bound, not before
        print(f"router ({settings.routing}, index {settings.index.split('?')[0]}) on http://{settings.host}:{settings.port}"
              f" -> {len(settings.replicas)} replica(s)", file=sys.stderr, flush=True)

    serve(lambda: web.run_app(app, host=settings.host, port=settings.port, print=started, shutdown_timeout=30.0,
                              access_log=None), settings.host, settings.port)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m router``: the same program as ``kvemu router``."""
    import sys as _sys

    from shared.cli import run_module

    return run_module(_sys.modules[__name__], "python -m router", "run the cache-aware router in front of replicas", argv)
