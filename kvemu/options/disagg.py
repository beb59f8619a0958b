"""The disaggregated prefill / decode flags (replica/core/disagg.py), one definition for `kvemu sim`,
`sweep`, `up`, `router` and `replica`:

* the topology (sim, sweep, up): ``--prefill-replicas P --decode-replicas D`` beside ``--replicas``
  (colocated ones; 0 by default once P/D is asked for), and each pool's own shape where it differs from
  the cluster's: ``--prefill-gpu`` / ``--decode-gpu`` (a preset, ``@tpN`` allowed), ``--prefill-tp`` /
  ``--decode-tp``, ``--prefill-capacity-gib`` / ``--decode-capacity-gib`` and ``--prefill-host-cache-gib`` /
  ``--decode-host-cache-gib``;
* the decider (sim, up, router): ``--pd-decider`` and ``--pd-threshold-tokens``;
* the link (sim, up, replica): ``--pd-link-gbps``, ``--pd-link-latency-us`` and ``--pd-transfer``.
"""

from __future__ import annotations

import argparse
import dataclasses

from kvemu.options.gpu import with_tp
from kvemu.options.option import Option, add_options
from replica.core.build import check_groups_served
from replica.core.disagg import (
    DEFAULT_PD_DECIDER,
    DEFAULT_PD_HOLD_SHARE,
    DEFAULT_PD_LATENCY_S,
    DEFAULT_PD_THRESHOLD_BLOCKS,
    PD_DECIDERS,
    PD_TRANSFERS,
    ROLES,
    PdCluster,
    PdSettings,
    PoolShape,
    Topology,
)
from router.strategies import strategy_spec
from shared.costmodel import CostModel, split_tp
from shared.errors import InputError, KvemuError
from shared.validate import check_number

PD_TOPOLOGY_OPTIONS = (
    Option("--prefill-replicas", 0, "prefill instances of a disaggregated (P/D) cluster (default 0: none)", int,
           metavar="P"),
    Option("--decode-replicas", 0, "decode instances of a P/D cluster (default 0: none)", int, metavar="D"),
)
PD_SHAPE_OPTIONS = tuple(
    Option(f"--{role}-{what}", None, f"the {role} pool's {text} (default: the cluster's {flag})", kind, metavar=meta)
    for role in ("prefill", "decode")
    for what, text, flag, kind, meta in (
        ("gpu", "GPU preset", "--gpu", str, "NAME"),
        ("tp", "tensor-parallel GPUs per instance", "--tp", int, "N"),
        ("capacity-gib", "GiB of KV per instance", "capacity", float, "G"),
        ("host-cache-gib", "host DRAM KV tier per instance, GiB", "--host-cache-gib", float, "G"),
    ))
PD_DECIDER_OPTIONS = (
    Option("--prefill-routing", None, "P/D: the routing strategy of the prefill pool (default: --routing's)",
           metavar="STRATEGY"),
    Option("--pd-decider", DEFAULT_PD_DECIDER, "P/D: which prompts go through a remote prefill: always, never, or"
           " prefix (llm-d's rule: when the tokens the decode instance lacks exceed --pd-threshold-tokens;"
           f" default {DEFAULT_PD_DECIDER})", choices=PD_DECIDERS),
    Option("--pd-threshold-tokens", None, "P/D prefix decider: remote prefill above this many tokens the decode"
           f" instance lacks (default {DEFAULT_PD_THRESHOLD_BLOCKS} blocks' worth)", int, metavar="N"),
)
PD_LINK_OPTIONS = (
    Option("--pd-link-gbps", None, "P/D transfer network: Gb/s of each instance's NIC per GPU (default: the GPU's"
           " NIC generation, 400 for H100 / H200, 200 for A100; times --tp)", float, metavar="GBIT/S"),
    Option("--pd-link-latency-us", DEFAULT_PD_LATENCY_S * 1e6, "P/D transfer base latency, microseconds (default"
           f" {DEFAULT_PD_LATENCY_S * 1e6:g}, NIXL over RDMA)", float, metavar="US"),
    Option("--pd-transfer", "missing", "P/D: the KV that crosses: missing (only what the decode instance lacks,"
           " as vLLM's NIXL connector reads) or full (the whole prompt)", choices=PD_TRANSFERS),
)
ROLE_OPTION = Option("--role", "both", "this replica's role: both (prefills and decodes its requests), prefill or"
                     " decode (a disaggregated P/D cluster)", choices=ROLES)


def add_pd_args(p: argparse.ArgumentParser, *, topology: bool = True, decider: bool = True, link: bool = True) -> None:
    g = p.add_argument_group("disaggregated prefill / decode (P/D)")
    if topology:
        add_options(g, PD_TOPOLOGY_OPTIONS + PD_SHAPE_OPTIONS)
    if decider:
        add_options(g, PD_DECIDER_OPTIONS)
    if link:
        add_options(g, PD_LINK_OPTIONS)


def pd_settings(args: argparse.Namespace) -> PdSettings:
    """The decider and link flags as one validated ``PdSettings`` (flags a command lacks keep their default)."""
    latency_us = getattr(args, "pd_link_latency_us", DEFAULT_PD_LATENCY_S * 1e6)
    check_number("--pd-link-latency-us", latency_us, minimum=0)
    link = getattr(args, "pd_link_gbps", None)
    if link is not None:
        check_number("--pd-link-gbps", link, above=0)
    threshold = getattr(args, "pd_threshold_tokens", None)
    if threshold is not None and threshold < 0:
        raise InputError("--pd-threshold-tokens", f"must be an integer >= 0, got {threshold}")
    return PdSettings(decider=getattr(args, "pd_decider", DEFAULT_PD_DECIDER), threshold_tokens=threshold,
                      link_gbps=link, link_latency_s=latency_us / 1e6, transfer=getattr(args, "pd_transfer", "missing"))


def topology(args: argparse.Namespace, replicas: int) -> Topology:
    """The cluster's replicas: ``replicas`` colocated ones (the --replicas flag, which defaults to 0 once
    P/D pools are asked for) beside the pools."""
    return Topology(replicas, args.prefill_replicas, args.decode_replicas)


def colocated_default(args: argparse.Namespace, given: int | None, default: int) -> int:
    """``--replicas`` as given, else ``default`` for a colocated cluster and 0 beside P/D pools."""
    if given is not None:
        return given
    return 0 if (args.prefill_replicas or args.decode_replicas) else default


def pd_cluster(args: argparse.Namespace, gpu: str, cost_of, block_size: int, tiers_for) -> PdCluster | None:
    """The P/D pools the flags ask for (None: a colocated cluster), refusing per-pool flags that would do
    nothing. ``cost_of(gpu) -> CostModel`` prices a pool's GPU; ``tiers_for(cost, host_gib)`` builds its tiers."""
    if not (args.prefill_replicas or args.decode_replicas):
        given = [o.flag for o in PD_SHAPE_OPTIONS + PD_DECIDER_OPTIONS + PD_LINK_OPTIONS
                 if getattr(args, o.dest, o.default) != o.default]
        if given:
            raise InputError(given[0], "does nothing without P/D pools: give --prefill-replicas P"
                                       " --decode-replicas D, or drop it")
        return None
    check_groups_served(cost_of(gpu), "--prefill-replicas", "P/D's transfer of each group's blocks is not modelled"
                                                             " yet (vLLM 0.33's NixlConnector moves them)")
    routing = getattr(args, "prefill_routing", None)
    if routing is not None:
        try:
            strategy_spec(routing)  # an unknown name lists the known ones
        except KvemuError as exc:
            raise InputError("--prefill-routing", str(exc)) from None
    return PdCluster(args.prefill_replicas, args.decode_replicas, pd_settings(args),
                     _shape(args, "prefill", gpu, cost_of, block_size, tiers_for),
                     _shape(args, "decode", gpu, cost_of, block_size, tiers_for), routing)


def _shape(args, role: str, gpu: str, cost_of, block_size: int, tiers_for) -> PoolShape:
    pool_gpu, tp = getattr(args, f"{role}_gpu"), getattr(args, f"{role}_tp")
    gib, host = getattr(args, f"{role}_capacity_gib"), getattr(args, f"{role}_host_cache_gib")
    if tp is not None and tp < 1:
        raise InputError(f"--{role}-tp", f"must be an integer >= 1, got {tp}")
    cluster_base, cluster_tp = split_tp(gpu)
    if tp is None and pool_gpu is None:
        resolved = gpu
    else:
        resolved = with_tp(pool_gpu or cluster_base, tp or (cluster_tp if pool_gpu is None else 1))
    try:
        cost: CostModel = cost_of(resolved)  # an unknown preset fails here, naming it and the flag
    except KvemuError as exc:
        raise InputError(f"--{role}-gpu" if pool_gpu else f"--{role}-tp", str(exc)) from None
    blocks = _own_budget(args, role, cost, block_size) if resolved != gpu and gib is None else None
    if gib is not None:
        check_number(f"--{role}-capacity-gib", gib, above=0)
        blocks = cost.gib_to_blocks(gib, block_size)
        if blocks < 1:
            raise InputError(f"--{role}-capacity-gib", f"{gib:g} GiB holds no block of {block_size} tokens of this model")
    tiers = None
    if host is not None:
        check_number(f"--{role}-host-cache-gib", host, minimum=0)
        tiers = tiers_for(cost, host)
    return PoolShape(None if resolved == gpu else resolved, blocks, tiers)


def _own_budget(args, role: str, cost: CostModel, block_size: int) -> int | None:
    """A pool on another GPU than the cluster's, sized by vLLM's memory rule: its own GPU's KV under the
    one ``--gpu-memory-utilization`` asked (None: the capacity was given in blocks, tokens or GiB, the
    same memory on every GPU)."""
    util = getattr(args, "gpu_memory_utilization", None)
    if not util:
        return None
    values = [float(x) for x in str(util).split(",") if x.strip()]
    if len(values) != 1:
        raise InputError(f"--{role}-capacity-gib", f"the {role} pool runs another GPU: with several"
                                                   " --gpu-memory-utilization values, give its capacity")
    budget = cost.kv_budget(values[0], getattr(args, "token_budget", 8192), getattr(args, "max_running", 256),
                            block_size)
    return budget.check()


def with_role_defaults(shape: PoolShape, **cluster) -> dict:
    """A pool's settings: the cluster's ``cluster`` values where the shape leaves them (None)."""
    out = dict(cluster)
    for f in dataclasses.fields(shape):
        value = getattr(shape, f.name)
        if value is not None:
            out[f.name] = value
    return out


# ---- the replica's own (kvemu replica; kvemu up hands them to its P/D replicas) -----------------------------
PD_HOLD_TIMEOUT_OPTION = Option(
    "--pd-hold-timeout-s", 480.0, "P/D prefill instance: wall seconds a finished prefill's blocks wait for a decode"
    " instance's pull before they are released (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT; default 480)", float,
    metavar="S")
PD_HOLD_SHARE_OPTION = Option(
    "--pd-hold-share", DEFAULT_PD_HOLD_SHARE, "P/D prefill instance: the fraction of its KV pool one client address"
    " without the cluster token may hold in prefills for remote decodes at once (queued, running and held, counted"
    " by prompt blocks); a prefill leg beyond it gets 429. kvemu's router presents the token and is not bounded;"
    f" 1 leaves only the pool's own limit (default {DEFAULT_PD_HOLD_SHARE:g})", float, metavar="F")
PD_PEERS_OPTION = Option(
    "--pd-peers", None, "P/D decode instance: the prefill instances (HOST:PORT or URL, comma-separated) it may pull KV"
    " from or ask SGLang's bootstrap of; any other address a request names is refused before any connection"
    " (`kvemu up` lists its own replicas). Default: any address for a pull, which presents only the transfer's own"
    " credential; a bootstrap needs the cluster token, presented only to these peers", str, metavar="PEERS")
REPLICA_PD_OPTIONS = (ROLE_OPTION, *PD_LINK_OPTIONS, PD_HOLD_TIMEOUT_OPTION, PD_HOLD_SHARE_OPTION, PD_PEERS_OPTION)


def add_replica_pd_args(p: argparse.ArgumentParser) -> None:
    """``kvemu replica``'s P/D flags: its role, its NIC and what crosses it, the hold timeout and share."""
    add_options(p.add_argument_group("disaggregated prefill / decode (P/D)"), REPLICA_PD_OPTIONS)


def replica_pd_settings(args: argparse.Namespace) -> dict:
    """The ``ReplicaSettings`` fields those flags give (``role``, ``pd``, ``pd_hold_timeout_s``, ``pd_hold_share``,
    ``pd_peers``)."""
    check_number("--pd-hold-timeout-s", args.pd_hold_timeout_s, above=0)
    check_number(PD_HOLD_SHARE_OPTION.flag, args.pd_hold_share, maximum=1, above=0)
    return {"role": args.role, "pd": pd_settings(args), "pd_hold_timeout_s": args.pd_hold_timeout_s,
            "pd_hold_share": args.pd_hold_share,
            "pd_peers": peers_setting(args.pd_peers)}


def peers_setting(text: str | None) -> tuple[str, ...] | None:
    """``--pd-peers`` as ``host:port`` addresses (None: not given, any address). A URL's scheme and path go."""
    if text is None:
        return None
    peers = []
    for item in filter(None, (x.strip() for x in text.split(","))):
        host, sep, port = item.split("://")[-1].split("/")[0].rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise InputError(PD_PEERS_OPTION.flag, f"expected HOST:PORT or http://HOST:PORT, got {item!r:.80}")
        peers.append(f"{host.strip('[]').lower()}:{int(port)}")
    if not peers:
        raise InputError(PD_PEERS_OPTION.flag, "names no peer; leave it out to allow any address")
    return tuple(peers)
