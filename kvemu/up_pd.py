"""``kvemu up``'s disaggregated prefill / decode part: the topology it starts (``--prefill-replicas P
--decode-replicas D`` beside ``--replicas``), each pool's shape on its replicas' command lines, and the
checks made before any process starts (kvemu.options.disagg holds every flag)."""

from __future__ import annotations

import argparse

from kvemu.options.disagg import PD_HOLD_SHARE_OPTION, PD_HOLD_TIMEOUT_OPTION, colocated_default, pd_cluster, topology
from kvemu.options.limits import CAPACITY_OPTIONS
from kvemu.options.tiers import tier_settings
from replica.core.disagg import PdCluster, Topology
from shared.costmodel import CostModel
from shared.errors import InputError
from shared.validate import check_number


def pool_args(flags: argparse.Namespace, pd: PdCluster | None, role: str) -> argparse.Namespace:
    """The flags of a ``role`` pool's replicas: the cluster's, with the pool's own GPU, capacity and host
    tier where its shape flags gave them (the plan's ``pd``, kvemu.options.disagg), in a copy."""
    shape = pd.shape(role) if pd is not None and role != "both" else None
    if shape is None:
        return flags
    own: dict[str, object] = {}
    if shape.gpu is not None:
        own["gpu"] = shape.gpu
    if shape.capacity_blocks is not None:
        own.update({o.dest: None for o in CAPACITY_OPTIONS}, capacity_blocks=shape.capacity_blocks)
    host = getattr(flags, f"{role}_host_cache_gib")
    if host is not None:
        own["host_cache_gib"] = host
    return argparse.Namespace(**{**vars(flags), **own})


def plan_topology(flags: argparse.Namespace) -> Topology:
    """``--replicas`` (0 by default beside P/D pools) and the pools as one ``Topology``: a pool without the
    other, or no replica at all, is one line (its message)."""
    replicas = colocated_default(flags, flags.replicas, flags.default_replicas)
    if replicas < 0 or replicas > 64:
        raise InputError("--replicas", f"must be 0-64, got {replicas}")
    topo = topology(flags, replicas)  # its InputError names the flag
    if topo.total > 64:
        raise InputError("--replicas", f"at most 64 replicas in all, got {topo.total}")
    return topo


def plan_pools(flags: argparse.Namespace, block_size: int) -> PdCluster | None:
    """The P/D pools' shapes, decider and link flags (None for a colocated cluster), as the router and
    each P/D replica would check them."""
    pd = pd_cluster(flags, flags.gpu, lambda gpu: CostModel.from_names(flags.model, gpu), block_size,
                    lambda cost, host: tier_settings(argparse.Namespace(**{**vars(flags), "host_cache_gib": host}),
                                                     cost, block_size))
    if pd is not None and not flags.pd_hold_timeout_s > 0:
        raise InputError(PD_HOLD_TIMEOUT_OPTION.flag, f"must be > 0, got {flags.pd_hold_timeout_s}")
    if pd is not None:
        check_number(PD_HOLD_SHARE_OPTION.flag, flags.pd_hold_share, maximum=1, above=0)
    return pd
