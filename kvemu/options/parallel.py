"""``--data-parallel-size N`` and ``--enable-expert-parallel``: vLLM's flags of the same names, one definition
for sim, sweep, replica and up.

``--data-parallel-size N``: an instance is N ranks, each its own scheduler and KV pool on its own GPUs (each
rank a ``--tp`` group), requests balanced over them as vLLM's DP coordinator does (replica/core/dp.py).
``--enable-expert-parallel``: a MoE model's experts split over the DP x TP GPUs, the ranks stepping in lockstep
with the all-to-all dispatch and combine of every MoE layer (shared/expert_parallel.py); refused for a dense
model (a flag that would do nothing) and without DP ranks to split over."""

from __future__ import annotations

import argparse

from kvemu.options.option import Option
from replica.core.dp import DpSettings
from shared.costmodel import ModelSpec
from shared.errors import InputError
from shared.expert_parallel import check_expert_parallel

DATA_PARALLEL_SIZE = Option(
    "--data-parallel-size", 1, type=int, metavar="N",
    help="ranks per instance, each its own scheduler and KV pool, requests balanced over them by waiting x 4 +"
         " running as vLLM's DP coordinator does (default 1)")
ENABLE_EXPERT_PARALLEL = Option(
    "--enable-expert-parallel", False, switch=True,
    help="MoE models: split the experts over the DP x TP GPUs; the DP ranks step in lockstep (an idle rank runs a"
         " dummy batch) and each MoE layer pays an all-to-all dispatch and combine on the GPUs' link")
OPTIONS = (DATA_PARALLEL_SIZE, ENABLE_EXPERT_PARALLEL)


def add_parallel_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    for option in OPTIONS:
        option.add(p)


def parallel_setting(args: argparse.Namespace, model: ModelSpec) -> DpSettings:
    """The two flags, checked in one line each naming the flag."""
    size = getattr(args, "data_parallel_size", 1)
    if not isinstance(size, int) or size < 1:
        raise InputError("--data-parallel-size", f"must be an integer >= 1, got {size!r}")
    enabled = bool(getattr(args, "enable_expert_parallel", False))
    check_expert_parallel(model, enabled, size)
    return DpSettings(size, enabled)


def expert_ranks(dp: DpSettings, tp: int) -> int:
    """The GPUs each expert layer is split over, for the memory rule (``DpSettings.expert_ranks``)."""
    return dp.expert_ranks(tp)


def ranks_line(dp: DpSettings, blocks: int, unit: str = "blocks") -> str | None:
    """What a live replica of several ranks prints at start, after its capacity (None with one rank)."""
    if dp.size == 1:
        return None
    ep = (" experts split over the ranks' GPUs (each holds its share: the capacity above counts it), ranks in lockstep;"
          if dp.expert_parallel else "")
    return (f"data parallel: {dp.size} ranks, each its own scheduler and KV pool of {blocks:,} {unit};{ep} a request"
            " goes to the rank its X-data-parallel-rank header names, else the least loaded by waiting x 4 + running")
