"""The memory-tier flags, one definition for `kvemu sim`, `sweep`, `replica` and `up` (host DRAM and SSD,
levels 1 and 2 of the hierarchy; replica/core/tiers/levels.py)."""

from __future__ import annotations

import argparse

from kvemu.options.option import Option, add_options
from replica.core.tiers.levels import SSD_READ_GBPS, SSD_WRITE_GBPS
from replica.core.tiers.stack import FETCH_MODES, TIER_MODES, TierSettings
from shared.costmodel import CostModel
from shared.errors import InputError
from shared.validate import check_number, check_positive_int

TIER_OPTIONS = (
    Option("--host-cache-gib", 0.0, "host DRAM KV tier per replica, GiB (default 0: none)", float, metavar="G"),
    Option("--ssd-cache-gib", 0.0, "SSD KV tier per replica, GiB (default 0: none)", float, metavar="G"),
    Option("--tier-policy", "", "eviction policy of each lower tier (default lru), e.g. host=s3fifo,ssd=lru",
           metavar="host=P,ssd=P"),
    Option("--tier-mode", "exclusive", "inclusive: copy each block to host as it is produced; exclusive: demote on eviction",
           choices=TIER_MODES),
    Option("--fetch", "auto", "restore blocks a lower tier holds: always, never, or auto (when faster than recomputing)",
           choices=FETCH_MODES),
    Option("--ssd-drives", 1, "NVMe drives the SSD tier is striped over: each adds its read and write bandwidth"
                              f" ({SSD_READ_GBPS:g} / {SSD_WRITE_GBPS:g} GB/s, one PCIe 4.0 drive; default 1)", int,
           metavar="N"),
    Option("--ssd-drive-read-gbps", SSD_READ_GBPS, f"one drive's read rate, GB/s (default {SSD_READ_GBPS:g})", float,
           metavar="GB/S"),
    Option("--ssd-drive-write-gbps", SSD_WRITE_GBPS, f"one drive's write rate, GB/s (default {SSD_WRITE_GBPS:g}); a drive's"
                                               " writes share it with its reads", float, metavar="GB/S"),
    Option("--host-link-gbps", None, "host<->GPU bandwidth per direction (default: the GPU preset's)", float,
           metavar="GB/S"),
    Option("--separate-tp-link", False,
           "price a --tp all-reduce over PCIe apart from the host copies (default on a PCIe GPU such as"
           " a100-80gb-pcie: the two share the link, as they share its lanes; elsewhere the all-reduce has a"
           " link of its own and this changes nothing)", switch=True),
    Option("--no-hbm-caching", False,
           "HBM keeps no KV between requests: each finished request moves down (CachedAttention)", switch=True),
)


def add_tier_args(p: argparse.ArgumentParser) -> None:
    add_options(p.add_argument_group("memory tiers below HBM (FlashGen)"), TIER_OPTIONS)


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
    check_positive_int("--ssd-drives", args.ssd_drives)
    check_number("--ssd-drive-read-gbps", args.ssd_drive_read_gbps, above=0)
    check_number("--ssd-drive-write-gbps", args.ssd_drive_write_gbps, above=0)
    extra = {} if args.host_link_gbps is None else {"host_link_gbps": args.host_link_gbps}
    extra.update(ssd_read_gbps=args.ssd_drive_read_gbps * args.ssd_drives, ssd_write_gbps=args.ssd_drive_write_gbps * args.ssd_drives)
    tiers = tiers_on(cost, block_size, args.host_cache_gib, args.ssd_cache_gib, host_policy=policies["host"],
                     ssd_policy=policies["ssd"], mode=args.tier_mode, fetch=args.fetch,
                     hbm_caching=not args.no_hbm_caching, shared_tp_link=not args.separate_tp_link, **extra)
    check_tier_flags(args, tiers, cost, block_size)
    return tiers


def check_tier_flags(args: argparse.Namespace, tiers: TierSettings, cost: CostModel, block_size: int) -> None:
    """Refuse tier flags that would do nothing: a tier smaller than one block, and a flag that shapes
    the lower tiers given without any (a flag at its default is never refused)."""
    one = cost.block_bytes(block_size) / 2**30  # GiB of one block (per replica: all its GPUs)
    for flag, gib, blocks in (("--host-cache-gib", args.host_cache_gib, tiers.host_blocks),
                              ("--ssd-cache-gib", args.ssd_cache_gib, tiers.ssd_blocks)):
        if gib > 0 and blocks == 0:
            raise InputError(flag, f"{gib:g} GiB holds 0 blocks of {block_size} tokens of this model's KV (one block is"
                                   f" {one * 1024:.3g} MiB): give at least {_round_up(one)} GiB, or 0 for no tier")
    for flag, dest in (("--ssd-drives", "ssd_drives"), ("--ssd-drive-read-gbps", "ssd_drive_read_gbps"),
                       ("--ssd-drive-write-gbps", "ssd_drive_write_gbps")):
        default = next(o.default for o in TIER_OPTIONS if o.flag == flag)
        if getattr(args, dest) != default and tiers.ssd_blocks == 0:
            raise InputError(flag, "does nothing without an SSD tier: add --ssd-cache-gib, or drop it")
    if tiers.enabled or getattr(args, "shared_cache_gib", 0) > 0:  # a shared store is a level below HBM too
        return
    given = {option.flag: getattr(args, option.dest) != option.default for option in TIER_OPTIONS}
    for flag in ("--no-hbm-caching", "--tier-policy", "--tier-mode", "--fetch", "--host-link-gbps", "--separate-tp-link"):
        if given[flag]:
            raise InputError(flag, "does nothing without a memory tier below HBM: add --host-cache-gib or"
                                   " --ssd-cache-gib")


def _round_up(gib: float) -> str:
    """``gib`` rounded up at 3 significant digits, so that it always gives the block it names."""
    import math

    digits = 2 - math.floor(math.log10(gib))
    return f"{math.ceil(gib * 10**digits) / 10**digits:.{max(digits, 0)}f}"


def tiers_on(cost: CostModel, block_size: int, host_gib: float, ssd_gib: float, shared_tp_link: bool = True,
             **settings) -> TierSettings:
    """Tiers of ``host_gib`` / ``ssd_gib`` under the cost model's GPU: its host link (per direction,
    each of ``tp`` GPUs has its own) and per-copy cost unless ``settings`` say otherwise. On a GPU
    whose ``--tp`` all-reduce crosses PCIe, the host link carries it too (unless ``shared_tp_link``
    is False): the bytes of each step's token, per direction over the ``tp`` GPUs' links, and the
    seconds per token they take alone at the link's bus bandwidth (``CostModel.tp_link_per_token``: the
    all-reduces' per-call latency stays in the step, it holds no bytes on the link)."""
    settings.setdefault("host_link_gbps", cost.gpu.host_bandwidth * cost.tp / 1e9)
    settings.setdefault("host_copy_overhead_s", cost.gpu.host_copy_overhead_s)
    if shared_tp_link and cost.gpu.tp_over_host_link and cost.tp > 1:
        seconds, nbytes = cost.tp_link_per_token()
        settings.setdefault("tp_comm_s_per_token", seconds)
        settings.setdefault("tp_bytes_per_token", nbytes)
    return TierSettings(host_blocks=cost.gib_to_blocks(host_gib, block_size),
                        ssd_blocks=cost.gib_to_blocks(ssd_gib, block_size), **settings)
