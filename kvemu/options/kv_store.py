"""The shared KV level's flags (replica/core/tiers/shared.py), for `kvemu sim`, `sweep` and `up`:
``--shared-cache-gib`` (the store's capacity; 0, the default: none), ``--shared-chunk-tokens``,
``--shared-eviction``, ``--shared-write``, ``--shared-nic-gbps``, ``--shared-store-gbps``,
``--shared-ttfb-us`` and ``--shared-scope``. Live, the store is a `kvemu store` process
(replica/kvstore/service.py): it takes ``STORE_OPTIONS`` (every flag but the scope, which is up's: one store per
group), and a replica takes them too with ``--shared-store-url`` (its store), so both shape one store alike.
Until the next release each renamed flag still answers to its old spelling (``--shared-pool-gbps``,
``--shared-pool-url``): "pool" is the block pool."""

from __future__ import annotations

import argparse

from kvemu.options.option import Option, add_options
from replica.core.tiers.shared import (
    DEFAULT_NIC_GBPS,
    DEFAULT_STORE_GBPS,
    DEFAULT_TTFB_S,
    SHARED_EVICTIONS,
    SHARED_WRITES,
    SharedSettings,
)
from shared.costmodel import CostModel
from shared.errors import InputError
from shared.validate import check_number

SHARED_OPTIONS = (
    Option("--shared-cache-gib", 0.0, "a KV store every replica reads and writes (Mooncake's store, LMCache's remote"
           " level), GiB in all, below each replica's own tiers (default 0: none)", float, metavar="G"),
    Option("--shared-chunk-tokens", None, "its objects: chunks of N tokens of a prompt, a multiple of the block size"
           " (LMCache 256; default one block); chunks of several blocks need --shared-write through", int,
           metavar="N"),
    Option("--shared-eviction", "mooncake", "mooncake: from a 90%% high watermark evict 5%% of objects, least"
           " recently used first, skipping those read in the last 10 s; lru: one at a time", choices=SHARED_EVICTIONS),
    Option("--shared-write", "evict", "evict: a replica writes what its last own level evicts; through: every full"
           " chunk it computes (LMCache's write-through at prefill)", choices=SHARED_WRITES),
    Option("--shared-nic-gbps", DEFAULT_NIC_GBPS, f"each replica's link to the store, Gb/s per direction (default"
           f" {DEFAULT_NIC_GBPS:g})", float, metavar="GBIT/S"),
    Option("--shared-store-gbps", DEFAULT_STORE_GBPS, f"the store's aggregate bandwidth, Gb/s per direction, shared by"
           f" every replica's transfers (default {DEFAULT_STORE_GBPS:g})", float, metavar="GBIT/S",
           aliases=("--shared-pool-gbps",)),
    Option("--shared-ttfb-us", DEFAULT_TTFB_S * 1e6, f"a read's metadata round trip to the store, microseconds"
           f" (default {DEFAULT_TTFB_S * 1e6:g})", float, metavar="US"),
    Option("--shared-scope", 0, "replicas per store: 0, one store for the cluster (default); K, one per K replicas"
           " in id order", int, metavar="K"),
)


# what shapes one store (a store process and each replica using it take these): every flag but the scope
STORE_OPTIONS = tuple(o for o in SHARED_OPTIONS if o.flag != "--shared-scope")
SHARED_STORE_URL = Option("--shared-store-url", None, "the shared KV store (a `kvemu store` process) this replica"
                          " reads and writes; give it the store's --shared-* flags too (kvemu up does)", metavar="URL",
                          aliases=("--shared-pool-url",))


def add_shared_args(p: argparse.ArgumentParser) -> None:
    add_options(p.add_argument_group("a KV store shared by the replicas"), SHARED_OPTIONS)


def add_replica_shared_args(p: argparse.ArgumentParser) -> None:
    """A replica's: its store's URL and the flags that shape the store (the store's own)."""
    group = p.add_argument_group("the shared KV store (kvemu store) below this replica's own tiers")
    SHARED_STORE_URL.add(group)
    add_options(group, STORE_OPTIONS)


def add_store_args(p: argparse.ArgumentParser) -> None:
    add_options(p.add_argument_group("the store"), STORE_OPTIONS)


def replica_shared_settings(args: argparse.Namespace, cost: CostModel, block_size: int) -> SharedSettings | None:
    """A replica's shared level: None without ``--shared-store-url``; with it, ``--shared-cache-gib`` too."""
    url = args.shared_store_url
    if url is None:
        return shared_settings(args, cost, block_size, None)  # the shaping flags without a store: refused
    if not args.shared_cache_gib:
        raise InputError("--shared-store-url", "needs the store's --shared-cache-gib (and its other --shared-* flags)")
    return shared_settings(args, cost, block_size, None)


def shared_settings(args: argparse.Namespace, cost: CostModel, block_size: int,
                    replicas: int | None) -> SharedSettings | None:
    """The flags as one validated ``SharedSettings`` (capacity and chunks in blocks of ``block_size``); None
    without a store, refusing the flags that would shape one."""
    gib = check_number("--shared-cache-gib", args.shared_cache_gib, minimum=0)
    if gib == 0:
        given = [o.flag for o in SHARED_OPTIONS[1:] if getattr(args, o.dest, o.default) != o.default]
        if given:
            raise InputError(given[0], "shapes a shared KV store, but there is none: give --shared-cache-gib G")
        return None
    blocks = cost.gib_to_blocks(gib, block_size)
    if blocks < 1:
        raise InputError("--shared-cache-gib", f"{gib:g} GiB holds no block of {block_size} tokens of this model")
    chunk = args.shared_chunk_tokens
    if chunk is not None and (chunk < block_size or chunk % block_size):
        raise InputError("--shared-chunk-tokens", f"must be a multiple of the block size ({block_size} tokens),"
                                                  f" got {chunk}")
    if chunk is not None and chunk > block_size and args.shared_write == "evict":
        raise InputError("--shared-write", f"chunks of {chunk} tokens are written whole, at prefill: give --shared-write"
                                           " through (a replica's evictions come a block at a time)")
    scope = getattr(args, "shared_scope", 0)
    if replicas is not None and (scope < 0 or scope > replicas):
        raise InputError("--shared-scope", f"must be 0 (the whole cluster) or a group size of 1 to {replicas} replicas"
                                           f" (the cluster has {replicas}), got {scope}")
    ttfb = check_number("--shared-ttfb-us", args.shared_ttfb_us, minimum=0)
    check_number("--shared-nic-gbps", args.shared_nic_gbps, above=0)
    check_number("--shared-store-gbps", args.shared_store_gbps, above=0)
    return SharedSettings(blocks, (chunk or block_size) // block_size, args.shared_eviction, args.shared_write,
                          args.shared_nic_gbps, args.shared_store_gbps, ttfb / 1e6, scope)
