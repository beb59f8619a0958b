"""``kvemu replica`` (``python -m kvemu replica``): run one emulated GPU."""

from __future__ import annotations

import argparse
import logging
import sys

from kvemu.options.backend import BACKEND_OPTIONS
from kvemu.options.disagg import add_replica_pd_args, replica_pd_settings
from kvemu.options.gpu import add_gpu_args, gpu_setting
from kvemu.options.index import CLUSTER
from kvemu.options.kv_cache_dtype import KV_CACHE_DTYPE, model_setting
from kvemu.options.kv_events import add_kv_events_arg
from kvemu.options.kv_store import add_replica_shared_args
from kvemu.options.limits import (
    CAPACITY_OPTIONS,
    MAX_MODEL_LEN,
    capacity_note,
    default_capacity,
    length_warning,
    replica_capacity,
)
from kvemu.options.matching import add_matching_args, matching_setting
from kvemu.options.option import add_options
from kvemu.options.parallel import add_parallel_args, parallel_setting, ranks_line
from kvemu.options.prefix_caching import PREFIX_CACHING, prefix_caching_setting
from kvemu.options.replica_flags import ADMIN_TOKEN, MODEL, POLICY, TIME_SCALE, given_admin_token
from kvemu.options.response_kv import add_response_kv_arg
from kvemu.options.reuse import SHARDS_RATE
from kvemu.options.scheduler import add_scheduler_args
from kvemu.options.serving import add_server_args
from kvemu.options.speculative import add_speculative_args
from kvemu.options.tiers import add_tier_args


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    p.add_argument("--replica-id", default=None, help="default: replica-<port>")
    from replica.settings import live_policy_names

    POLICY.add(p, help=f"eviction policy: {', '.join(live_policy_names())} (default {POLICY.default})")
    p.add_argument("--policy-param", action="append", default=[], metavar="NAME=VALUE")
    add_options(p.add_mutually_exclusive_group(), CAPACITY_OPTIONS)  # none: vLLM's default (default_capacity)
    MAX_MODEL_LEN.add(p)
    MODEL.add(p)
    KV_CACHE_DTYPE.add(p)
    add_gpu_args(p)
    add_matching_args(p)
    TIME_SCALE.add(p)
    add_scheduler_args(p, live=True)
    add_speculative_args(p)
    p.add_argument("--index", default=None, help="redis://host:port/db to publish KV events to a shared index")
    CLUSTER.add(p)
    ADMIN_TOKEN.add(p)
    SHARDS_RATE.add(p)
    add_response_kv_arg(p)
    PREFIX_CACHING.add(p)
    add_tier_args(p)
    add_options(p, BACKEND_OPTIONS)
    add_server_args(p)
    add_kv_events_arg(p)
    add_replica_pd_args(p)
    add_replica_shared_args(p)
    add_parallel_args(p)
    p.add_argument("--log-level", default="warning")




def settings_from_args(args):
    import dataclasses

    from kvemu.options.knobs import engine_knobs
    from kvemu.options.kv_events import kv_events_setting
    from kvemu.options.kv_store import replica_shared_settings
    from kvemu.options.scheduler import check_scheduler_flags
    from kvemu.options.serving import serving_settings
    from kvemu.options.tiers import tier_settings
    from replica.backends import check_backend_flags
    from replica.core.build import check_groups_served
    from replica.settings import ReplicaSettings, check_live_policy
    from shared.costmodel import CostModel

    args.model = model_setting(args)
    check_backend_flags(args)
    check_scheduler_flags(args)
    default_capacity(args)
    matching = matching_setting(args)
    cost = CostModel.from_names(args.model, args.gpu)
    if args.role != "both":
        check_groups_served(cost, "--role", "P/D's transfer of each group's blocks is not modelled yet (vLLM 0.33's"
                                            " NixlConnector moves them): run it colocated")
    if args.backend != "emulated":
        check_groups_served(cost, "--backend", "the torch backend attends over every block: use --backend emulated")
    tiers = dataclasses.replace(tier_settings(args, cost, matching.block_size),
                                shared=replica_shared_settings(args, cost, matching.block_size))
    prefix_caching_setting(args, tiers, args.backend)  # off on another backend: refused, naming the flag
    check_live_policy(args.policy)
    knobs = engine_knobs(args, matching, tiers)
    capacity_note(args, matching.block_size, matching.mode)  # a pool of no block or page: refused, naming the flag
    return ReplicaSettings(
        replica_id=args.replica_id or f"replica-{args.port}", port=args.port, knobs=knobs,
        **replica_capacity(args, matching.mode), max_model_len=args.max_model_len, model=args.model,
        gpu=gpu_setting(args), block_size=matching.block_size, time_scale=args.time_scale,
        max_waiting=args.max_waiting, index=args.index, cluster=args.cluster, admin_token=given_admin_token(args),
        serving=serving_settings(args), backend=args.backend, device=args.device, layers=args.layers,
        kv_events=kv_events_setting(args), shared_store_url=args.shared_store_url, dp=parallel_setting(args, cost.model),
        **replica_pd_settings(args))


def print_limits(settings, out=None) -> None:
    """On stderr at start: the capacity --gpu-memory-utilization (or its default) gives, and the one-line warning
    where the pool cannot hold one request of max_model_len (kvemu.options.limits)."""
    out = out or sys.stderr
    each = f"each of the {settings.dp.size} DP ranks: " if settings.dp.size > 1 else ""
    if settings.gpu_memory_utilization is not None:
        print(each + settings.kv_budget().line(), file=out, flush=True)
    ranks = ranks_line(settings.dp, settings.resolved_capacity_blocks(), "pages" if settings.knobs.matching == "radix"
                       else "blocks")
    if ranks:
        print(ranks, file=out, flush=True)
    warning = length_warning(settings.asked_max_model_len(), settings.max_model_len is not None,
                             settings.resolved_capacity_blocks(), settings.kv_block_size(), settings.knobs.matching)
    if warning:
        print(warning, file=out, flush=True)
    if settings.role == "prefill" and settings.knobs.response_kv == "keep":
        print("role prefill: response KV is not stored (--response-kv keep does not apply: a prefill instance's"
              " responses are decoded elsewhere)", file=out, flush=True)


def run(args) -> int:
    from kvemu.options.serving import token_line
    from replica.app import make_app

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = settings_from_args(args)
    if settings.shared_store_url is not None and settings.knobs.tiers.shared is not None:  # down at start: one line
        from replica.kvstore.client import check_store

        check_store(settings.shared_store_url, settings.knobs.tiers.shared, settings.cost_model().block_bytes(settings.block_size))
    app = make_app(settings)  # make_policy turns a bad --policy-param into an InputError
    from shared.http_server import bind, serve

    sock = bind(settings.serving.host, settings.port)
    print_limits(settings)
    note = capacity_note(args, settings.block_size, settings.knobs.matching)
    if note:
        print(note, file=sys.stderr, flush=True)
    print(token_line(args), file=sys.stderr, flush=True)
    if getattr(args, "admin_token", None):
        from kvemu.options.replica_flags import ADMIN_TOKEN, ADMIN_TOKEN_ENV
        from kvemu.options.serving import command_line_token_warning

        print(command_line_token_warning(ADMIN_TOKEN.flag, ADMIN_TOKEN_ENV), file=sys.stderr, flush=True)
    unit = "pages" if settings.knobs.matching == "radix" else "blocks"
    role = "" if settings.role == "both" else f", role {settings.role}"
    ranks = f" x {settings.dp.size} DP ranks" if settings.dp.size > 1 else ""
    print(f"replica {settings.replica_id} ({settings.knobs.policy}, {settings.resolved_capacity_blocks()} {unit}{ranks}{role})"
          f" on http://{settings.serving.host}:{settings.port}", file=sys.stderr, flush=True)
    serve(app, sock)
    return 0
