"""``kvemu router`` (``python -m kvemu router``): the cache-aware router process."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import fields

from kvemu.options.disagg import PD_DECIDER_OPTIONS, pd_settings
from kvemu.options.index import CLUSTER
from kvemu.options.matching import BLOCK_SIZE, MATCHING_OPTION, PAGE_SIZE, matching_setting
from kvemu.options.option import Option, add_options, forward
from kvemu.options.router_flags import ROUTING_OPTIONS
from kvemu.options.serving import SERVER_OPTIONS, add_server_args, token_line
from router.settings import RouterSettings
from shared.errors import InputError

MATCHING = (MATCHING_OPTION, PAGE_SIZE, BLOCK_SIZE)  # the router hashes prompts as its replicas do

# The router process's own flags (kvemu router, kvemu up): how often it samples its replicas (health,
# dashboard) and the per-client limits (router/limits.py, off by default), RouterSettings's defaults.
_ROUTER = {f.name: f.default for f in fields(RouterSettings)}
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
    Option("--upstream-first-byte-timeout", _ROUTER["upstream_first_byte_timeout_s"], type=float, metavar="S",
           help="seconds a replica may keep a request without its answer starting (a stream's first token; a"
                " non-streamed answer, sent whole when done) or a stream without its next bytes before the router asks"
                " its /health: one that does not answer is set aside and the request retried on another replica (a"
                " stream already started ends with an error event and [DONE]); one that answers is waited for again,"
                " so a long generation never trips it (default %(default)s)"),
)

# The shared KV stores the replicas use, a flag of the router alone: `kvemu up` starts the stores and
# passes each one's URL (and scope group) to the router.
SHARED_STORE = Option("--shared-store", (), metavar="URL[=ID,...]", repeat=True, aliases=("--shared-pool",),
                      help="a shared KV store (`kvemu store`) the replicas use: the router follows its event feed (with a"
                           " Redis index, reads what the store ships there) so that cache_aware prices a hit in it"
                           " (shared_hit_cost), and /cluster and the dashboard show it; once per store; =ID,... the"
                           " replica ids it serves (a --shared-scope group; default every replica)")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    p.add_argument("--replicas", required=True, help="comma-separated replica URLs, each optionally ROLE=URL (ROLE:"
                   " both, prefill or decode: a disaggregated P/D cluster; without one, the role the replica reports)")
    p.add_argument("--index", default="memory", help="memory (embedded) or redis://host:port/db")
    add_options(p, (*ROUTING_OPTIONS, CLUSTER, *MATCHING))
    p.add_argument("--seed", type=int, default=None)
    add_server_args(p)
    add_options(p, ROUTER_OPTIONS)
    add_options(p, (SHARED_STORE,))
    add_options(p.add_argument_group("disaggregated prefill / decode (P/D)"), PD_DECIDER_OPTIONS)
    p.add_argument("--workers", type=int, default=1,
                   help="router processes sharing the port; a supervisor restarts any that dies")
    p.add_argument("--listen-fd", type=int, default=None, help=argparse.SUPPRESS)  # a worker's inherited socket
    p.add_argument("--log-level", default="warning")


def settings_from_args(args):
    from kvemu.options.router_flags import live_levels, routing_settings
    from kvemu.options.serving import serving_settings

    matching = matching_setting(args)  # the replicas' hashing unit: a block, or a radix page
    stores = shared_stores(args.shared_store)
    # levels: host DRAM, SSD, and the shared store last where there is one, as kvemu sim prices them
    levels = live_levels(bool(stores))
    routing = routing_settings(matching.block_size, args.set, levels, mode=matching.mode)
    replicas, roles = replica_roles(args.replicas)
    return RouterSettings(replicas=replicas, roles=roles, pd=pd_settings(args), prefill_routing=args.prefill_routing,
                          port=args.port, routing=args.routing, index=args.index,
                          cluster=args.cluster, block_size=matching.block_size, matching=matching.mode, routing_settings=routing,
                          health_interval_s=args.health_interval, dashboard_interval_s=args.dashboard_interval,
                          seed=args.seed, serving=serving_settings(args),
                          client_max_in_flight=args.client_max_in_flight, client_rate=args.client_rate,
                          client_burst=args.client_burst, shared_stores=stores,
                          upstream_first_byte_timeout_s=args.upstream_first_byte_timeout,
                          shared_level=len(levels) if stores else 0)


def shared_stores(values) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``--shared-store`` values: each store's URL and the replica ids it serves (none: every replica)."""
    out = []
    for value in values:
        url, sep, ids = value.strip().partition("=")
        served = tuple(i.strip() for i in ids.split(",") if i.strip())
        if sep and not served:
            raise InputError("--shared-store", f"{value!r}: give the replica ids after '=' (URL=replica-0,replica-1)"
                                              " or none (the store serves every replica)")
        out.append((url.strip().rstrip("/"), served))
    return tuple(out)


def replica_roles(value: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``--replicas``'s URLs and each one's role ("": none given): ``URL`` or ``ROLE=URL``."""
    from replica.core.disagg import ROLES, check_role

    urls, roles = [], []
    for item in (u.strip() for u in value.split(",")):
        if not item:
            continue
        role, sep, url = item.partition("=")
        if not sep or "://" in role:
            role, url = "", item
        elif role not in ROLES:
            check_role(role, "--replicas")
        urls.append(url.strip())
        roles.append(role)
    return tuple(urls), tuple(roles)


def worker_args(args) -> list[str]:
    """The arguments a worker gets: this router's, without ``--workers``."""
    out = ["--port", str(args.port), "--host", args.host, "--replicas", args.replicas, "--index", args.index,
           "--log-level", args.log_level,
           *forward((*ROUTING_OPTIONS, CLUSTER, *MATCHING, *SERVER_OPTIONS, *ROUTER_OPTIONS, *PD_DECIDER_OPTIONS,
                     SHARED_STORE), args)]
    if args.seed is not None:
        out += ["--seed", str(args.seed)]
    if args.cluster_token:  # through the environment, not the command line other users can read
        os.environ["KVEMU_CLUSTER_TOKEN"] = args.cluster_token
    return out


def run(args) -> int:
    import socket

    from router.app import make_app
    from shared.http_server import bind, serve

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = settings_from_args(args)
    if not 1 <= args.workers <= 64:
        raise InputError("workers", f"must be 1-64, got {args.workers}")
    if args.workers > 1:
        from router.workers import supervise

        print(token_line(args), file=sys.stderr, flush=True)  # once, not again by each worker
        return supervise(worker_args(args), settings.serving.host, settings.port, args.workers)
    if args.listen_fd is not None:
        sock = socket.socket(fileno=args.listen_fd)
        sock.setblocking(False)
    else:
        sock = bind(settings.serving.host, settings.port)
    app = make_app(settings)
    if args.listen_fd is None:  # a worker's supervisor said it already
        print(token_line(args), file=sys.stderr, flush=True)
    print(f"router ({settings.routing}, index {settings.index.split('?')[0]}) on http://{settings.serving.host}:{settings.port}"
          f" -> {len(settings.replicas)} replica(s)", file=sys.stderr, flush=True)
    serve(app, sock)
    return 0
