"""One frozen settings object per replica process, validated at start."""

from __future__ import annotations

from dataclasses import dataclass

from replica.backends import check_backend
from replica.core.build import CoreSettings
from replica.core.cache.policies import policy_class, policy_names
from replica.core.sched.scheduler import check_scheduler
from replica.core.tiers.stack import TierSettings
from shared.auth import check_bind
from shared.costmodel import CostModel
from shared.errors import InputError, UnknownNameError
from shared.offload import OffloadSettings
from shared.serve import ConnLimits
from shared.validate import check_positive_int


def live_policy_names() -> list[str]:
    """The policies a live replica can run: every one but the offline oracles."""
    return [n for n in policy_names() if not policy_class(n).needs_future]




@dataclass(frozen=True, slots=True)
class ReplicaSettings:
    replica_id: str = "replica-0"
    host: str = "127.0.0.1"
    port: int = 8100
    policy: str = "lru"
    policy_params: tuple[tuple[str, object], ...] = ()
    capacity_blocks: int | None = None
    capacity_gib: float | None = None
    model: str = "qwen3-coder-30b-a3b"
    gpu: str = "h200"
    block_size: int = 16
    hit_mode: str = "holes"
    time_scale: float = 1.0  # wall seconds slept per emulated second; 0 = as fast as possible
    token_budget: int = 8192
    max_running: int = 256
    max_waiting: int = 10_000
    scheduler: str = "fcfs"  # admission order: fcfs (vLLM) or reorder (seed 001)
    max_body_bytes: int = 8 * 1024 * 1024
    max_prompt_tokens: int = 1_048_576
    max_output_tokens: int = 65_536
    parse_workers: int = 1  # processes that parse big bodies off the event loop (0 = inline)
    offload_bytes: int = 256 * 1024  # bodies from this size on are parsed in those processes
    large_bodies_per_client: int = 2  # big bodies one client address may have being parsed (429 beyond)
    max_connections: int = 4096  # beyond it a new connection gets a 503 and is closed
    header_timeout_s: float = 10.0  # a request head must arrive within this
    body_timeout_s: float = 30.0  # a request body must arrive within this (408 otherwise)
    write_timeout_s: float = 30.0  # a client that keeps the send buffer full (reads nothing) this long is cut off
    index: str | None = None  # redis://... ; None = the embedded feed a router polls
    cluster: str = "default"
    admin_token: str | None = None
    cluster_token: str | None = None  # /kv/* and raw session ids; required beyond loopback (shared/auth.py)
    shards_rate: float = 0.1  # 0.1 keeps the sampled MRC within 0.02 of the exact one (tests/replica/test_reuse.py)
    shards_max_tracked: int = 1 << 16
    event_batch_max: int = 512
    feed_max_batches: int = 4096  # the embedded feed keeps this many recent batches
    feed_max_hashes: int = 1 << 18  # ... holding at most this many hashes (about 12 MB)
    seed: int = 0
    tiers: TierSettings = TierSettings()  # host DRAM / SSD below HBM (replica.core.tiers.stack)
    response_kv: str = "keep"  # keep: cache each response's full blocks (colocated vLLM); drop: do not
    backend: str = "emulated"  # or "torch": real kernels over a real paged KV tensor (replica/backends/)
    device: str = "cpu"  # the torch backend's device
    layers: int | None = None  # the torch backend runs this many of the model's layers (None: all)

    def __post_init__(self) -> None:
        if self.policy not in live_policy_names():  # an oracle needs the future: `kvemu sim` only
            oracles = sorted(set(policy_names()) - set(live_policy_names()))
            raise UnknownNameError("policy", self.policy, live_policy_names(),
                                   f" ({', '.join(oracles)} need the future and run in `kvemu sim` only)")
        if not self.replica_id or len(self.replica_id) > 128:
            raise InputError("replica_id", "must be 1-128 characters")
        if not (0 <= self.port <= 65535):
            raise InputError("port", f"must be 0-65535, got {self.port}")
        if (self.capacity_blocks is None) == (self.capacity_gib is None):
            raise InputError("capacity", "give exactly one of capacity_blocks or capacity_gib")
        if self.capacity_blocks is not None:
            check_positive_int("capacity_blocks", self.capacity_blocks)
        if self.capacity_gib is not None and not 0 < self.capacity_gib < float("inf"):
            raise InputError("capacity_gib", f"must be a finite number > 0, got {self.capacity_gib}")
        for name in ("block_size", "token_budget", "max_running", "max_waiting", "max_body_bytes",
                     "max_prompt_tokens", "max_output_tokens", "event_batch_max",
                     "feed_max_batches", "feed_max_hashes", "shards_max_tracked"):
            check_positive_int(name, getattr(self, name))
        check_scheduler(self.scheduler)
        if self.hit_mode not in ("prefix", "holes"):
            raise InputError("hit_mode", f"must be prefix or holes, got {self.hit_mode!r}")
        for name in ("header_timeout_s", "body_timeout_s", "write_timeout_s"):
            if not 0 < getattr(self, name) < float("inf"):
                raise InputError(name, f"must be a positive number of seconds, got {getattr(self, name)}")
        check_positive_int("max_connections", self.max_connections)
        check_positive_int("offload_bytes", self.offload_bytes)
        check_positive_int("large_bodies_per_client", self.large_bodies_per_client)
        if not 0 <= self.parse_workers <= 64:
            raise InputError("parse_workers", f"must be 0-64, got {self.parse_workers}")
        if not (self.time_scale >= 0):
            raise InputError("time_scale", f"must be >= 0, got {self.time_scale}")
        if not (0 < self.shards_rate <= 1):
            raise InputError("shards_rate", f"must be in (0, 1], got {self.shards_rate}")
        if self.index is not None and not self.index.startswith(("redis://", "rediss://", "unix://")):
            raise InputError("index", f"expected a redis:// URL, got {self.index!r}")
        check_bind(self.host, self.cluster_token)
        check_backend(self.backend, self.layers)
        CostModel.from_names(self.model, self.gpu)  # unknown names list the valid ones
        if self.capacity_gib is not None and self.resolved_capacity_blocks() <= 0:
            raise InputError("capacity_gib", "is smaller than one KV block of this model")

    def offload(self) -> OffloadSettings:
        return OffloadSettings(self.parse_workers, self.offload_bytes, self.large_bodies_per_client)

    def conn_limits(self) -> ConnLimits:
        return ConnLimits(self.max_connections, self.header_timeout_s, self.body_timeout_s, self.write_timeout_s)

    def core_settings(self) -> CoreSettings:
        """The cache core this replica runs (``replica.core.build``)."""
        return CoreSettings(
            capacity_blocks=self.resolved_capacity_blocks(), policy=self.policy, policy_params=self.policy_params,
            block_size=self.block_size, hit_mode=self.hit_mode, token_budget=self.token_budget,
            max_running=self.max_running, max_waiting=self.max_waiting, scheduler=self.scheduler, reuse="shards",
            shards_rate=self.shards_rate, shards_max_tracked=self.shards_max_tracked, seed=self.seed, emit_events=True,
            tier_events=True, oracles=False, tiers=self.tiers, response_kv=self.response_kv)

    def cost_model(self) -> CostModel:
        return CostModel.from_names(self.model, self.gpu)

    def resolved_capacity_blocks(self) -> int:
        if self.capacity_blocks is not None:
            return self.capacity_blocks
        assert self.capacity_gib is not None  # exactly one of the two is set (__post_init__)
        return self.cost_model().gib_to_blocks(self.capacity_gib, self.block_size)

