"""``kvemu up``'s disaggregated prefill / decode part: the topology it starts (``--prefill-replicas P
--decode-replicas D`` beside ``--replicas``), each pool's shape on its replicas' command lines, and the
checks made before any process starts (kvemu.options.pd holds every flag)."""

from __future__ import annotations

import argparse

from kvemu.options.limits import CAPACITY_OPTIONS
from kvemu.options.pd import PD_HOLD_SHARE_OPTION, PD_HOLD_TIMEOUT_OPTION, colocated_default, pd_cluster, topology
from kvemu.options.tiers import tier_settings
from shared.costmodel import CostModel
from shared.errors import InputError
from shared.validate import check_number


def pool_args(a, role: str):
    """The flags of a ``role`` pool's replicas: the cluster's, with the pool's own GPU, capacity and host
    tier where its shape flags gave them (validate's ``a.pd``, kvemu.options.pd)."""
    shape = a.pd.shape(role) if getattr(a, "pd", None) is not None and role != "both" else None
    if shape is None:
        return a
    out = argparse.Namespace(**vars(a))
    if shape.gpu is not None:
        out.gpu = shape.gpu
    if shape.capacity_blocks is not None:
        for o in CAPACITY_OPTIONS:
            setattr(out, o.dest, None)
        out.capacity_blocks = shape.capacity_blocks
    host = getattr(a, f"{role}_host_cache_gib", None)
    if host is not None:
        out.host_cache_gib = host
    return out


def members_of(a) -> list[tuple[str, str]]:
    """``(replica id, role)`` of every replica up starts: the topology validate built (colocated ones alone
    when none was)."""
    topo = getattr(a, "topology", None)
    return topo.members() if topo is not None else [(f"replica-{i}", "both") for i in range(a.replicas)]


def validate_topology(a) -> None:
    """``--replicas`` (0 by default beside P/D pools) and the pools as one ``Topology``: a pool without the
    other, or no replica at all, is one line (its message)."""
    a.replicas = colocated_default(a, a.replicas, getattr(a, "default_replicas", 4))
    if a.replicas < 0 or a.replicas > 64:
        raise InputError("--replicas", f"must be 0-64, got {a.replicas}")
    a.topology = topology(a, a.replicas)  # its InputError names the flag
    if a.topology.total > 64:
        raise InputError("--replicas", f"at most 64 replicas in all, got {a.topology.total}")


def validate_pools(a, block_size: int) -> None:
    """The P/D pools' shapes, decider and link flags (``a.pd``, None for a colocated cluster), as the router and
    each P/D replica would check them."""
    a.pd = pd_cluster(a, a.gpu, lambda gpu: CostModel.from_names(a.model, gpu), block_size,
                      lambda cost, host: tier_settings(argparse.Namespace(**{**vars(a), "host_cache_gib": host}), cost,
                                                       block_size))
    if a.pd is not None and not a.pd_hold_timeout_s > 0:
        raise InputError(PD_HOLD_TIMEOUT_OPTION.flag, f"must be > 0, got {a.pd_hold_timeout_s}")
    if a.pd is not None:
        check_number(PD_HOLD_SHARE_OPTION.flag, a.pd_hold_share, maximum=1, above=0)
