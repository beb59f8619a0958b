"""What a simulation is asked to run (``SimSettings``: the cluster and the run around the knobs every replica's
core shares, ``EngineKnobs``; a sweep's point id hashes it) and how it resolves into each replica's core (``core_settings``): the settings
half of sim/simulator.py."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from loadgen.arrivals import ARRIVAL_MODES
from replica.core.build import SIM_REUSE_MODES, CoreSettings, EngineKnobs, check_choice
from replica.core.disagg import PdCluster
from replica.core.dp import DpSettings
from replica.core.sched.sched_types import max_model_len_for
from router.strategies import RoutingSettings, strategy_spec
from shared.costmodel import CostModel
from shared.errors import InputError
from shared.validate import check_positive_int

KNOB_FIELDS = tuple(f.name for f in fields(EngineKnobs))


@dataclass(frozen=True, slots=True)
class SimSettings:
    capacity_blocks: int
    # What every replica's core runs with (policy, matching, scheduler, tiers, ...; replica.core.build.EngineKnobs,
    # the live replica's too): with "radix" matching the trace's block size is the page size. A sweep's point id
    # hashes its fields as if they were this record's own (sim.sweep.settings_dict).
    knobs: EngineKnobs = EngineKnobs()
    replicas: int = 1
    routing: str = "cache_aware"
    model: str = "qwen3-coder-30b-a3b"
    gpu: str = "h200"
    # Reuse distances for the miss-ratio curve: "sampled" (SHARDS at shards_rate: within 0.01 of
    # exact on the sample traces at a fraction of the cost), "exact", "off", or "auto" (the
    # default: sampled in batching mode; off in cache-only mode, whose point is speed).
    reuse: str = "auto"
    routing_settings: RoutingSettings | None = None
    # Session causality, as `kvemu replay` sends: turn j+1 arrives when turn j has finished plus
    # the trace's gap between them (not at its own trace time). Turn 0 keeps its trace time.
    causal: bool = False
    # --arrivals: "dependent", a request that waits for others (a trace's ``after``) arrives when the last of them
    # has finished plus its ``gap_s``, on the simulated clock; "recorded": at its trace time. The rule is
    # loadgen/arrivals.py's, the live replay's too; a trace without dependencies runs the same either way.
    arrivals: str = "dependent"
    # Cache-only replay: requests one at a time in trace order through routing, pool and policy
    # only; no scheduler and no cost-model clock (so no queue to overflow), as cache simulators do.
    cache_only: bool = False
    # vLLM's length rule: a request whose prompt plus output exceeds it is refused (counted in
    # ``refused``; the run goes on). None: the model's context window; the pool's size where smaller.
    max_model_len: int | None = None
    # The compiled pool where it is the Python pool's exact twin (replica.core.compiled.pool.compilable
    # decides: LRU, S3-FIFO, Belady or BeladyCompute; no tiers or reorder; kept response KV with LRU or S3-FIFO;
    # 64-bit unsigned hashes); False: the Python pool everywhere.
    compiled: bool = True
    # A disaggregated cluster: prefill and decode pools beside the ``replicas`` colocated ones (which may
    # then be 0); None: colocated only (replica/core/disagg.py, sim/pd_flow.py)
    pd: PdCluster | None = None
    # vLLM's --data-parallel-size: each replica (instance) is this many ranks, each its own scheduler and pool
    # of ``capacity_blocks``, balanced as vLLM's DP coordinator does; ``expert_parallel``: the ranks of a MoE
    # model split its experts and step in lockstep (replica/core/dp.py, sim/dp.py)
    data_parallel_size: int = 1
    expert_parallel: bool = False

    def __post_init__(self) -> None:
        if self.pd is None:
            check_positive_int("replicas", self.replicas)
        else:
            self.pd.topology(self.replicas)  # both pools, and a count for each (the one message)
            if self.cache_only:
                raise InputError("cache_only", "a P/D cluster moves KV over a link in time: run it in the batching"
                                               " mode (drop --cache-only)")
        check_positive_int("capacity_blocks", self.capacity_blocks)
        check_choice("reuse", self.reuse, SIM_REUSE_MODES)
        check_choice("arrivals", self.arrivals, ARRIVAL_MODES)
        if self.max_model_len is not None:
            check_positive_int("max_model_len", self.max_model_len)
        strategy_spec(self.routing)
        self._check_parallel()

    def _check_parallel(self) -> None:
        DpSettings(self.data_parallel_size, self.expert_parallel)  # a size >= 1; EP with 2 ranks or more
        if self.data_parallel_size > 1 and self.pd is not None:
            raise InputError("data_parallel_size", "DP ranks inside P/D instances are not emulated: drop one of them")
        if self.data_parallel_size > 1 and self.cache_only:
            raise InputError("data_parallel_size", "DP ranks are balanced by their queues, which the cache-only mode"
                                                   " has not: run it in the batching mode (drop --cache-only)")

    @classmethod
    def of(cls, **given: Any) -> SimSettings:
        """From one flat set of keywords, the knobs' (``EngineKnobs``) and this record's own alike: what the Python
        API takes (kvemu/api.py)."""
        knobs = {name: given.pop(name) for name in KNOB_FIELDS if name in given}
        return cls(knobs=EngineKnobs(**knobs), **given)

    @property
    def reuse_mode(self) -> str:
        """``reuse`` with "auto" resolved."""
        if self.reuse == "auto":
            return "off" if self.cache_only else "sampled"
        return self.reuse



def max_model_len(s: SimSettings, cost: CostModel, block_size: int) -> int:
    """The length limit every replica of ``s`` runs with: ``max_model_len``, else the model's context
    window; the pool's size in tokens where the pool cannot hold one request of that length."""
    return max_model_len_for(s.max_model_len or cost.model.max_context, s.capacity_blocks,
                             cost.kv_block_size(block_size))  # the model's blocks (state layers raise the size)


def core_settings(s: SimSettings, block_size: int, cost: CostModel, indexed: bool, requests: int) -> CoreSettings:
    """The core each replica of ``s`` runs (what a live replica's ``ReplicaSettings.core_settings`` gives
    for the same flags, but for what only virtual time has: oracles, exact reuse, an unbounded queue)."""
    # Virtual time refuses nothing: the waiting queue can hold every request of the trace (a live
    # replica's bound answers overload with 503; here it would only abort a long backlogged run).
    return CoreSettings(
        capacity_blocks=s.capacity_blocks, knobs=s.knobs, block_size=block_size, max_waiting=max(requests, 1),
        reuse=s.reuse_mode, shards_max_tracked=1 << 62, emit_events=indexed, oracles=True, stream_tokens=False,
        compiled=s.compiled, max_model_len=max_model_len(s, cost, block_size))
