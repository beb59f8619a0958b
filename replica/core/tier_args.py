"""The memory-tier flags, one definition for `kvemu sim`, `sweep`, `replica` and `up`."""

from __future__ import annotations

import argparse

from replica.core.tiers.stack import FETCH_MODES, TIER_MODES, TierSettings
from shared.costmodel import CostModel
from shared.errors import InputError
from shared.validate import check_number


def add_tier_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("memory tiers below HBM (FlashGen)")
    g.add_argument("--host-cache-gib", type=float, default=0.0, metavar="G",
                   help="host DRAM KV tier per replica, GiB (default 0: none)")
    g.add_argument("--ssd-cache-gib", type=float, default=0.0, metavar="G",
                   help="SSD KV tier per replica, GiB (default 0: none)")
    g.add_argument("--tier-policy", default="", metavar="host=P,ssd=P",
                   help="eviction policy of each lower tier (default lru), e.g. host=s3fifo,ssd=lru")
    g.add_argument("--tier-mode", choices=TIER_MODES, default="exclusive",
                   help="inclusive: copy each block to host as it is produced; exclusive: demote on eviction")
    g.add_argument("--fetch", choices=FETCH_MODES, default="auto",
                   help="restore blocks a lower tier holds: always, never, or auto (when faster than recomputing)")
    g.add_argument("--host-link-gbps", type=float, default=None, metavar="GB/S",
                   help="host<->GPU bandwidth per direction (default: the GPU preset's)")
    g.add_argument("--no-hbm-caching", action="store_true",
                   help="HBM keeps no KV between requests: each finished request moves down (CachedAttention)")


def tier_settings(args: argparse.Namespace, cost: CostModel, block_size: int) -> TierSettings:
    """The flags as one validated ``TierSettings`` (capacities in blocks of ``block_size``)."""
    policies = {"host": "lru", "ssd": "lru"}
    for pair in filter(None, (x.strip() for x in args.tier_policy.split(","))):
        tier, sep, policy = pair.partition("=")
        if not sep or tier.strip() not in policies or not policy.strip():
            raise InputError("--tier-policy", f"expected host=POLICY or ssd=POLICY, got {pair!r}")
        policies[tier.strip()] = policy.strip()
    check_number("--host-cache-gib", args.host_cache_gib, minimum=0)
    check_number("--ssd-cache-gib", args.ssd_cache_gib, minimum=0)
    extra = {} if args.host_link_gbps is None else {"host_link_gbps": args.host_link_gbps}
    return tiers_on(cost, block_size, args.host_cache_gib, args.ssd_cache_gib, host_policy=policies["host"],
                    ssd_policy=policies["ssd"], mode=args.tier_mode, fetch=args.fetch,
                    hbm_caching=not args.no_hbm_caching, **extra)


def tiers_on(cost: CostModel, block_size: int, host_gib: float, ssd_gib: float, **settings) -> TierSettings:
    """Tiers of ``host_gib`` / ``ssd_gib`` under the cost model's GPU: its host link (per direction,
    each of ``tp`` GPUs has its own) and per-copy cost unless ``settings`` say otherwise."""
    settings.setdefault("host_link_gbps", cost.gpu.host_bandwidth * cost.tp / 1e9)
    settings.setdefault("host_copy_overhead_s", cost.gpu.host_copy_overhead_s)
    return TierSettings(host_blocks=cost.gib_to_blocks(host_gib, block_size),
                        ssd_blocks=cost.gib_to_blocks(ssd_gib, block_size), **settings)
