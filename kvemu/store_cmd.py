"""``kvemu store``: run the shared KV store process (replica/kvstore/service.py), the live store of the level every
replica of its scope reads and writes. ``kvemu up --shared-cache-gib G`` starts one per scope group;
a replica uses it with ``--shared-store-url`` and the same ``--shared-*`` flags. ``kvemu pool`` and ``--pool-id``
are its old spellings, kept for one release; so are ``pool_id`` / ``pool_gbps`` in its /health and /stats,
written beside ``store_id`` / ``store_gbps``, and its ``kvemu_pool_*`` series beside ``kvemu_store_*``."""

from __future__ import annotations

import argparse
import logging
import sys

from kvemu.options.gpu import add_gpu_args, gpu_setting
from kvemu.options.index import CLUSTER
from kvemu.options.kv_cache_dtype import KV_CACHE_DTYPE, model_setting
from kvemu.options.kv_store import add_store_args, shared_settings
from kvemu.options.matching import BLOCK_SIZE
from kvemu.options.replica_flags import MODEL, TIME_SCALE
from kvemu.options.serving import add_server_args
from shared.errors import InputError
from shared.hashing import DEFAULT_BLOCK_SIZE

DEFAULT_PORT = 8300


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    p.add_argument("--store-id", "--pool-id", default=None,
                   help="the id its event feed publishes under (default shared-store)")
    MODEL.add(p)
    KV_CACHE_DTYPE.add(p)
    add_gpu_args(p)
    BLOCK_SIZE.add(p)
    TIME_SCALE.add(p, help="wall seconds per emulated second, the replicas' (its leases and link run on it)")
    add_store_args(p)
    p.add_argument("--index", default=None, help="redis://host:port/db: publish what the store holds to a shared Redis"
                                                 " index too, as replicas do (default: routers read its feed)")
    CLUSTER.add(p)
    add_server_args(p)
    p.add_argument("--log-level", default="warning")


def settings_from_args(args):
    from kvemu.options.serving import serving_settings
    from replica.kvstore.service import DEFAULT_STORE_ID, StoreSettings
    from shared.costmodel import CostModel

    gpu, args.model = gpu_setting(args), model_setting(args)
    cost = CostModel.from_names(args.model, gpu)
    block_size = args.block_size or DEFAULT_BLOCK_SIZE
    if not args.shared_cache_gib:
        raise InputError("--shared-cache-gib", "a store needs a capacity: give --shared-cache-gib G (G > 0)")
    shared = shared_settings(args, cost, block_size, None)
    assert shared is not None
    return StoreSettings(shared=shared, block_bytes=cost.block_bytes(block_size), block_size=block_size,
                        store_id=args.store_id or DEFAULT_STORE_ID, port=args.port, time_scale=args.time_scale,
                        serving=serving_settings(args), index=args.index, cluster=args.cluster)


def run(args) -> int:
    from kvemu.options.serving import token_line
    from replica.kvstore.service import make_app
    from shared.http_server import bind, serve

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    settings = settings_from_args(args)
    app = make_app(settings)
    sock = bind(settings.serving.host, settings.port)
    print(token_line(args), file=sys.stderr, flush=True)
    s = settings.shared
    print(f"store {settings.store_id} ({s.blocks} blocks, chunks of {s.chunk_blocks}, {s.eviction}, write {s.write})"
          f" on http://{settings.serving.host}:{settings.port}", file=sys.stderr, flush=True)
    serve(app, sock)
    return 0
