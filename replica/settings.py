"""One frozen settings object per replica process, validated at start."""

from __future__ import annotations

from dataclasses import dataclass, replace

from replica.backends import check_backend
from replica.core.build import CoreSettings, EngineKnobs
from replica.core.cache.policies import policy_class, policy_names
from replica.core.disagg import DEFAULT_PD_HOLD_SHARE, PdSettings, check_role
from replica.core.dp import DpSettings
from replica.core.sched.sched_types import DEFAULT_MAX_WAITING, max_model_len_for
from shared import memory_rule
from shared.costmodel import CostModel, KvBudget, split_tp
from shared.errors import InputError, UnknownNameError
from shared.expert_parallel import check_expert_parallel
from shared.kv_events_config import KvEventsConfig
from shared.serving import ServingSettings
from shared.validate import check_number, check_positive_int

# vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT: a prefill instance frees a finished request's blocks if no
# decode instance has read them by then (wall-clock seconds, as vLLM's)
DEFAULT_PD_HOLD_TIMEOUT_S = 480.0


def live_policy_names() -> list[str]:
    """The policies a live replica can run: every one but the offline oracles."""
    return [n for n in policy_names() if not policy_class(n).needs_future]


def check_live_policy(policy: str) -> None:
    """A policy a live replica runs: an oracle needs the future (`kvemu sim` only); the error lists the others. A
    command checks it before the knobs (``EngineKnobs`` lists every policy, the oracles too)."""
    if policy not in live_policy_names():
        oracles = sorted(set(policy_names()) - set(live_policy_names()))
        raise UnknownNameError("policy", policy, live_policy_names(),
                               f" ({', '.join(oracles)} need the future and run in `kvemu sim` only)")




@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    replica_id: str = "replica-0"
    port: int = 8100
    # What the core runs with (policy, matching, scheduler, tiers, ...): the simulator's replicas' record too
    # (replica.core.build.EngineKnobs); a live replica runs no offline oracle policy
    knobs: EngineKnobs = EngineKnobs()
    capacity_blocks: int | None = None  # in the pool's unit: blocks of block_size tokens (pages under radix)
    capacity_tokens: int | None = None  # rounded down to whole blocks (pages)
    capacity_gib: float | None = None
    # vLLM's capacity rule: this fraction of each GPU's memory as CUDA reports it, less weights (with norms and the
    # rotary cache), the profiling run's peak activations and non-torch memory (shared/memory_rule.py)
    gpu_memory_utilization: float | None = None
    # vLLM's length rule: prompt plus max_tokens beyond it is refused (None: the model's context window;
    # the pool's size where that is smaller: resolved_max_model_len)
    max_model_len: int | None = None
    model: str = "qwen3-coder-30b-a3b"
    gpu: str = "h200"
    block_size: int = 16  # tokens per block; with knobs.matching "radix", per page
    time_scale: float = 1.0  # wall seconds slept per emulated second; 0 = as fast as possible
    max_waiting: int = DEFAULT_MAX_WAITING
    # binding, body limits, connection caps, timeouts and the cluster token, as the router has them
    serving: ServingSettings = ServingSettings()
    index: str | None = None  # redis://... ; None = the embedded feed a router polls
    cluster: str = "default"
    admin_token: str | None = None
    shards_max_tracked: int = 1 << 16
    event_batch_max: int = 512
    feed_max_batches: int = 4096  # the embedded feed keeps this many recent batches
    feed_max_hashes: int = 1 << 18  # ... holding at most this many hashes (about 12 MB)
    backend: str = "emulated"  # or "torch": real kernels over a real paged KV tensor (replica/backends/)
    device: str = "cpu"  # the torch backend's device
    layers: int | None = None  # the torch backend runs this many of the model's layers (None: all)
    kv_events: KvEventsConfig | None = None  # vLLM's KV events over ZMQ (--kv-events-config); None: off
    # disaggregated prefill / decode (replica/pd.py): both (colocated), prefill or decode
    role: str = "both"
    pd: PdSettings = PdSettings()  # this instance's NIC (link Gb/s per GPU, latency) and what crosses it
    pd_hold_timeout_s: float = DEFAULT_PD_HOLD_TIMEOUT_S
    # one client address without the cluster token may hold at most this fraction of the pool for remote
    # decodes (replica/pd_share.py)
    pd_hold_share: float = DEFAULT_PD_HOLD_SHARE
    # the prefill instances (host:port) a decode instance may contact for a request's KV; None: any (replica/pd.py)
    pd_peers: tuple[str, ...] | None = None
    # the shared KV store's process (replica/kvstore/service.py), where tiers.shared is set: its URL
    shared_store_url: str | None = None
    # --data-parallel-size / --enable-expert-parallel: this many ranks, each its own scheduler and pool of the
    # capacity above (replica/dp.py)
    dp: DpSettings = DpSettings()

    def __post_init__(self) -> None:
        check_live_policy(self.knobs.policy)
        if not self.replica_id or len(self.replica_id) > 128:
            raise InputError("replica_id", "must be 1-128 characters")
        if not (0 <= self.port <= 65535):
            raise InputError("port", f"must be 0-65535, got {self.port}")
        if sum(x is not None for x in (self.capacity_blocks, self.capacity_tokens, self.capacity_gib,
                                       self.gpu_memory_utilization)) != 1:
            raise InputError("capacity", "give exactly one of capacity_blocks, capacity_tokens, capacity_gib or"
                                         " gpu_memory_utilization")
        if self.max_model_len is not None:
            check_positive_int("max_model_len", self.max_model_len)
        for name in ("capacity_blocks", "capacity_tokens"):
            if getattr(self, name) is not None:
                check_positive_int(name, getattr(self, name))
        if self.capacity_gib is not None and not 0 < self.capacity_gib < float("inf"):
            raise InputError("capacity_gib", f"must be a finite number > 0, got {self.capacity_gib}")
        for name in ("block_size", "max_waiting", "event_batch_max", "feed_max_batches", "feed_max_hashes",
                     "shards_max_tracked"):
            check_positive_int(name, getattr(self, name))
        if self.knobs.prefix_caching == "off" and self.backend != "emulated":  # its KV slots are keyed by block hash
            raise InputError("prefix_caching", f"off runs on the emulated backend only, not {self.backend!r}")
        if not (self.time_scale >= 0):
            raise InputError("time_scale", f"must be >= 0, got {self.time_scale}")
        if self.index is not None and not self.index.startswith(("redis://", "rediss://", "unix://")):
            raise InputError("index", f"expected a redis:// URL, got {self.index!r}")
        check_backend(self.backend, self.layers)
        check_role(self.role)
        check_number("pd_hold_timeout_s", self.pd_hold_timeout_s, above=0)
        check_number("pd_hold_share", self.pd_hold_share, maximum=1, above=0)
        if (self.knobs.tiers.shared is None) != (self.shared_store_url is None):
            raise InputError("shared_store_url", "a shared level (tiers.shared) and the store's URL go together: a"
                                                " live replica's shared level is a `kvemu store` process")
        if self.shared_store_url is not None and not self.shared_store_url.startswith(("http://", "https://")):
            raise InputError("shared_store_url", f"expected an http:// URL, got {self.shared_store_url!r}")
        cost = CostModel.from_names(self.model, self.gpu)  # unknown names list the valid ones
        self._check_dp(cost)
        if self.capacity_gib is not None and self.resolved_capacity_blocks() <= 0:
            raise InputError("capacity_gib", "is smaller than one KV block of this model")
        if self.capacity_tokens is not None and self.resolved_capacity_blocks() <= 0:
            raise InputError("capacity_tokens", f"is less than one {'page' if self.knobs.matching == 'radix' else 'block'}"
                                                f" of {self.block_size} tokens")
        if self.gpu_memory_utilization is not None:
            self.kv_budget().check()  # nothing left for KV: one line naming the flag

    def _check_dp(self, cost: CostModel) -> None:
        """DP ranks where the live replica runs them: refusals name the flag, as the simulator's do."""
        check_expert_parallel(cost.model, self.dp.expert_parallel, self.dp.size)
        if self.dp.size == 1:
            return
        flag = "--data-parallel-size"
        if self.role != "both":
            raise InputError(flag, "DP ranks inside P/D instances are not emulated: drop one of them")
        if self.backend != "emulated":
            raise InputError(flag, f"DP ranks run on the emulated backend only, not {self.backend!r}")
        if self.shared_store_url is not None:
            raise InputError(flag, "DP ranks beside a shared KV store level are not emulated live: drop one of them")

    def core_settings(self) -> CoreSettings:
        """The cache core this replica runs (``replica.core.build``)."""
        return CoreSettings(
            capacity_blocks=self.resolved_capacity_blocks(), knobs=replace(self.knobs, response_kv=self.stored_response_kv),
            block_size=self.block_size, max_waiting=self.max_waiting, reuse="sampled",
            shards_max_tracked=self.shards_max_tracked, emit_events=True, tier_events=True, oracles=False,
            max_model_len=self.resolved_max_model_len())

    @property
    def stored_response_kv(self) -> str:
        """What the replica does with response KV: a prefill instance never stores it (its responses are one
        token, decoded elsewhere), whatever ``response_kv`` says."""
        return "drop" if self.role == "prefill" else self.knobs.response_kv

    def nic_bytes_per_s(self) -> float:
        """This instance's NIC, each direction (``PdSettings.nic_bytes_per_s``: --pd-link-gbps per GPU x tp,
        else the GPU preset's NIC generation)."""
        gpu, tp = split_tp(self.gpu)
        return self.pd.nic_bytes_per_s(gpu, tp)

    def cost_model(self) -> CostModel:
        return CostModel.from_names(self.model, self.gpu)

    def resolved_capacity_blocks(self) -> int:
        if self.capacity_blocks is not None:
            return self.capacity_blocks
        if self.capacity_tokens is not None:
            return self.capacity_tokens // self.block_size
        if self.capacity_gib is not None:
            return self.cost_model().gib_to_blocks(self.capacity_gib, self.block_size)
        return self.kv_budget().check()  # exactly one of the three is set (__post_init__)

    def kv_budget(self) -> KvBudget:
        """What ``gpu_memory_utilization`` leaves for KV (vLLM's profiling step; CostModel.kv_budget)."""
        assert self.gpu_memory_utilization is not None
        cost = self.cost_model()  # under expert parallelism each rank holds its share of the experts
        return memory_rule.kv_budget(cost, self.gpu_memory_utilization, self.knobs.token_budget, self.knobs.max_running,
                                     self.block_size, expert_ranks=self.dp.expert_ranks(cost.tp))

    def asked_max_model_len(self) -> int:
        """The length limit asked for: the setting, else the model's context window."""
        return self.max_model_len or self.cost_model().model.max_context

    def kv_block_size(self) -> int:
        """The tokens of one of the pool's blocks: ``block_size``, raised for a model's state layers as vLLM raises
        it (CostModel.kv_block_size)."""
        return self.cost_model().kv_block_size(self.block_size)

    def resolved_max_model_len(self) -> int:
        """The limit the replica runs with: the asked one, or the pool's size where that is smaller."""
        return max_model_len_for(self.asked_max_model_len(), self.resolved_capacity_blocks(), self.kv_block_size())

