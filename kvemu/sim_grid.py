"""What ``kvemu sim`` and ``kvemu sweep`` build alike from their flags: the lists they take, the cluster's size,
the parts every run of a grid shares (memory levels, routing settings, DP ranks, a P/D cluster) and each run's
``SimSettings`` around its knobs (kvemu/options/knobs.py)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import NamedTuple

from kvemu.options.disagg import pd_cluster
from kvemu.options.knobs import engine_knobs, naming_flags
from kvemu.options.kv_store import shared_settings
from kvemu.options.matching import Matching, matching_setting, source_unit
from kvemu.options.parallel import parallel_setting
from kvemu.options.router_flags import routing_settings
from kvemu.options.tiers import tier_settings
from loadgen.source import load_source
from loadgen.trace import Trace
from replica.core.disagg import PdCluster
from replica.core.dp import DpSettings
from replica.core.tiers.stack import TierSettings
from router.strategies import RoutingSettings
from shared.costmodel import CostModel
from shared.errors import InputError
from sim.settings import SimSettings


def split_numbers(text: str, conv, field: str, minimum_zero: bool = False) -> list:
    """A comma-separated list of finite positive numbers (``minimum_zero``: 0 allowed too)."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            value = conv(part)
        except ValueError:
            raise InputError(field, f"expected a comma-separated list of numbers, got {part!r}") from None
        if not (0 <= value if minimum_zero else 0 < value) or not value < float("inf"):  # also refuses nan
            raise InputError(field, f"must be a finite {'number >= 0' if minimum_zero else 'positive number'}, got {part}")
        out.append(value)
    if not out:
        raise InputError(field, "is empty")
    return out


def cluster_size(args: argparse.Namespace) -> int:
    """Replicas of the cluster the flags ask for (the largest of a sweep's), colocated and P/D alike."""
    counts = args.replicas if isinstance(args.replicas, int) else max(
        split_numbers(str(args.replicas or "1"), int, "--replicas", True))
    return counts + args.prefill_replicas + args.decode_replicas


class GridParts(NamedTuple):
    """What every run of a grid shares, sized in the trace's blocks."""

    tiers: TierSettings
    routing: RoutingSettings
    dp: DpSettings
    pd: PdCluster | None


def grid_parts(args: argparse.Namespace, block_size: int) -> GridParts:
    """The memory levels (a shared store sized for the largest cluster), routing settings, DP ranks and P/D pools
    the flags ask for, in blocks of ``block_size`` tokens (the trace's: the page size under radix)."""
    mode = matching_setting(args).mode
    cost = CostModel.from_names(args.model, args.gpu)
    tiers = dataclasses.replace(tier_settings(args, cost, block_size),
                                shared=shared_settings(args, cost, block_size, cluster_size(args)))
    routing = routing_settings(block_size, args.routing_set, tiers.levels(), mode)
    pd = pd_cluster(args, args.gpu, lambda gpu: CostModel.from_names(args.model, gpu), block_size,
                    lambda cost, gib: dataclasses.replace(tier_settings(
                        argparse.Namespace(**{**vars(args), "host_cache_gib": gib}), cost, block_size),
                        shared=tiers.shared))
    return GridParts(tiers, routing, parallel_setting(args, cost.model), pd)


def sim_settings(args: argparse.Namespace, parts: GridParts, *, policy: str, capacity_blocks: int, replicas: int,
                 routing: str, reuse: str, arrivals: str = "dependent") -> SimSettings:
    """One run of the grid: its policy, capacity, cluster and routing, the rest from the flags (every field
    checked by its record, a refusal naming its flag)."""
    knobs = engine_knobs(args, matching_setting(args), parts.tiers, policy)
    with naming_flags():
        return SimSettings(capacity_blocks=capacity_blocks, knobs=knobs, replicas=replicas, routing=routing,
                           model=args.model, gpu=args.gpu, reuse=reuse, routing_settings=parts.routing,
                           causal=args.causal, arrivals=arrivals, cache_only=args.cache_only,
                           max_model_len=args.max_model_len, compiled=not args.python_core, pd=parts.pd,
                           data_parallel_size=parts.dp.size, expert_parallel=parts.dp.expert_parallel)


def load_matched(args: argparse.Namespace, matching: Matching) -> Trace:
    """The source cut into the blocks ``matching`` serves at; a trace of hashes of another size is refused naming
    --model where the size is the model's (state layers), not a --block-size the user gave."""
    try:
        return load_source(args, source_unit(args, matching), tokens=matching.mode == "radix")
    except InputError as e:
        if e.field != "--block-size" or getattr(args, "block_size", None) is not None:
            raise
        raise InputError("--model", f"{args.model} is served in blocks of {matching.block_size} tokens (vLLM raises"
                                    " the block for its state layers to hold a state), and this trace's hash ids"
                                    " stand for blocks of another size, which cannot be cut: use a preset"
                                    " (--workload) or a request log (--format openai)") from None
