"""The Python API, for notebooks and scripts: the same runs as ``kvemu sim`` / ``kvemu estimate``,
returned as rows (one dict per run) instead of printed. See docs/python-api.md.

    from kvemu import api
    trace = api.load_trace("mooncake-conversation")
    rows = api.simulate(trace, policies=["lru", "s3fifo"], capacity_blocks=[4000, 18279])
    api.estimate(capacity_blocks=2275, arrival_rate=1.5, think_mean=45)["hit_ratio"]
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable

from kvemu.options.kv_cache_dtype import model_setting
from kvemu.options.limits import DEFAULT_GPU_MEMORY_UTILIZATION, RADIX_BLOCK_TOKENS, pool_units
from kvemu.options.router_flags import routing_settings as routing_settings_of
from loadgen.formats import read_trace
from loadgen.trace import Trace
from loadgen.workloads import generate
from replica.core.build import EngineKnobs
from replica.core.disagg import PdCluster, PdSettings, PoolShape
from replica.core.tiers.stack import TierSettings
from shared.errors import InputError
from shared.overrides import apply_overrides
from sim.run import simulate as _simulate
from sim.simulator import SimSettings

# What ``simulate`` takes by keyword (``SimSettings.of``): the knobs' fields and the simulation's own, each with its
# default
_DEFAULTS = {f.name: f.default for cls in (EngineKnobs, SimSettings) for f in dataclasses.fields(cls) if f.name != "knobs"}

__all__ = ["PdCluster", "PdSettings", "PoolShape", "Trace", "load_trace", "generate_trace", "simulate", "estimate"]


def load_trace(path: str, fmt: str = "auto", block_size: int | None = None) -> Trace:
    """A trace file (kvemu JSONL, Mooncake, Qwen-Bailian; ``.gz`` too) or a built-in trace's name."""
    return read_trace(path, fmt, block_size)


def generate_trace(workload: str, duration_s: float = 600.0, seed: int = 0, **params) -> Trace:
    """A workload preset (``kvemu gen --list``), its parameters overridden by keyword."""
    return generate(workload, duration_s, seed, {k: str(v) for k, v in params.items()})


def simulate(trace: Trace, policies: Iterable[str] = ("lru",), capacity_blocks: Iterable[int] | None = None, *,
             replicas: int | None = None, routing: str = "cache_aware", routing_settings: dict | None = None,
             kv_cache_dtype: str = "auto", **settings) -> list[dict]:
    """One virtual-time run per (policy, capacity), in that order: the rows of ``kvemu sim --json``.

    ``settings`` are ``SimSettings`` fields (``model``, ``gpu``, ``causal``, ``reuse``, ``cache_only``, ...) and
    the knobs every replica's core shares, ``EngineKnobs`` fields (``max_running``, ``token_budget``, ``hit_mode``,
    ``seed``, ``response_kv``, ``tiers``, ...), given alike by keyword, with the defaults every command has
    (``response_kv="keep"``, as a colocated vLLM). ``capacity_blocks`` counts blocks of 16 tokens under
    ``matching="radix"`` too, turned into pages, as ``kvemu sim`` does: the run dicts' ``capacity_blocks`` are
    the pool's pages then, ``capacity_tokens`` the same in either mode.
    Without ``capacity_blocks``: vLLM's default, the pool ``gpu_memory_utilization`` 0.9 of the model's GPU
    leaves (``default_blocks``), as every command without a capacity flag.

    A disaggregated cluster: ``pd=PdCluster(prefill, decode, PdSettings(...))`` (``replicas``, the colocated
    ones, then defaults to 0; ``docs/pd.md``). ``kv_cache_dtype``: ``--kv-cache-dtype`` (``fp8``: one byte a KV
    value), carried in ``model`` as the commands carry it."""
    if kv_cache_dtype != "auto":
        model = settings.get("model") or _DEFAULTS["model"]
        settings["model"] = model_setting(argparse.Namespace(model=str(model), kv_cache_dtype=kv_cache_dtype))
    if replicas is None:
        replicas = 0 if settings.get("pd") is not None else 1
    tiers = settings.get("tiers", TierSettings())
    mode = str(settings.get("matching", "blocks"))
    if capacity_blocks is None:
        capacity_blocks = [default_blocks(trace.block_size, **settings)]
    else:
        capacity_blocks = [c if mode != "radix" else pool_units("capacity_blocks", c, c * RADIX_BLOCK_TOKENS,
                                                               trace.block_size, mode)[0] for c in capacity_blocks]
    routing_cfg = routing_settings_of(trace.block_size, [f"{k}={v}" for k, v in (routing_settings or {}).items()],
                                      tiers.levels() if isinstance(tiers, TierSettings) else None,
                                      mode)
    for name in settings:
        if name not in _DEFAULTS:
            raise InputError(name, f"not a simulation setting; valid: {', '.join(sorted(_DEFAULTS))}")
    grid = [SimSettings.of(capacity_blocks=c, policy=p, replicas=replicas, routing=routing,
                           routing_settings=routing_cfg, **settings)
            for p in policies for c in capacity_blocks]  # every name checked before the first run
    return [_simulate(trace, s) for s in grid]


def default_blocks(block_size: int, **settings) -> int:
    """The blocks (pages under radix) vLLM's memory rule leaves at its default ``gpu_memory_utilization`` for
    ``settings``' model, GPU, token budget and running limit (``SimSettings``' defaults where not given): what
    ``kvemu sim`` runs with no capacity flag. Refused in one line where nothing is left for KV."""
    from shared.costmodel import CostModel

    pick = {name: settings.get(name, _DEFAULTS[name]) for name in ("model", "gpu", "token_budget", "max_running")}
    cost = CostModel.from_names(str(pick["model"]), str(pick["gpu"]))
    return cost.kv_budget(DEFAULT_GPU_MEMORY_UTILIZATION, int(pick["token_budget"]), int(pick["max_running"]),
                          block_size).check()


def estimate(trace: Trace | None = None, *, capacity_blocks: int | None = None,
             target_hit_ratio: float | None = None, practical: bool = False, **scm_params) -> dict:
    """The mean-field LRU estimate (the mean-field LRU analysis of multi-turn conversations): the dict ``kvemu estimate --json`` prints.

    From the ``scm`` model (``scm_params`` are its parameters, plus ``think_dist``, ``turn_dist``,
    ...) or, with ``trace``, from primitives measured on it. Give ``capacity_blocks`` for the hit
    ratio, or ``target_hit_ratio`` for the capacity that reaches it."""
    from kvemu.estimate_cmd import estimate_doc
    from sim.estimate import ScmModel, capacity_for, workload_from_trace

    if (capacity_blocks is None) == (target_hit_ratio is None):
        raise InputError("capacity_blocks", "give exactly one of capacity_blocks or target_hit_ratio")
    if trace is not None:
        if scm_params:
            raise InputError(next(iter(scm_params)), "applies to the scm model; a trace gives every primitive")
        work = workload_from_trace(trace, physical=practical)
        inputs = {"trace": trace.source, "block_size": trace.block_size, "requests": len(trace.requests)}
    else:
        model = apply_overrides(ScmModel(), {k: str(v) for k, v in scm_params.items()})
        work, inputs = model.workload(), {"workload": "scm", "params": dataclasses.asdict(model)}
    capacity = capacity_for(work, target_hit_ratio, practical) if target_hit_ratio is not None else capacity_blocks
    assert capacity is not None  # exactly one of the two was given (checked above)
    return estimate_doc(work, inputs, capacity, target_hit_ratio, practical)
