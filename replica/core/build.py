"""The one builder of a replica's cache core, for the live replica and the simulator alike."""

from __future__ import annotations

from dataclasses import dataclass

from replica.core.analysis.reuse import ReuseDistanceTracker
from replica.core.analysis.shards import ShardsTracker
from replica.core.cache.costs import DepthCosts
from replica.core.cache.group_events import GroupKeys
from replica.core.cache.grouped import GroupedPool
from replica.core.cache.metrics import PoolMetrics
from replica.core.cache.policies import make_policy, policy_class
from replica.core.cache.pool import HIT_MODES, BlockPool, KvEvent
from replica.core.cache.types import SchedulerPool
from replica.core.compiled.pool import CompiledPool, KernelLevels, why_not
from replica.core.sched import sched_types as limits
from replica.core.sched.sched_types import check_watermark
from replica.core.sched.scheduler import Scheduler, SchedulerSettings, check_admission
from replica.core.sched.spec_decode import SpecDecode
from replica.core.sched.v0_steps import DEFAULT_STEP_RULE, check_step_rule
from replica.core.tiers.shared import SharedStore
from replica.core.tiers.stack import TierSettings, TierStack
from shared.costmodel import CostModel
from shared.errors import InputError
from shared.kv_groups import FULL, STATE, WINDOW, KvGroups
from shared.validate import check_number, check_positive_int

# The choices a core is built with, each defined once here; their flags are in kvemu/options/.
# Of pool.HIT_MODES: vLLM's and SGLang's rule, only a prompt's leading run of cached blocks is reused;
# "holes" (every cached block is a hit wherever it sits, the gaps recomputed) is kept for the "When Fancy
# Eviction Fails" analysis, which counts hits that way, and must be asked for
DEFAULT_HIT_MODE = "prefix"
# Reuse distances: SHARDS-sampled at shards_rate (bounded memory), exact, or none.
REUSE_MODES = ("sampled", "exact", "off")
# What a simulator run may ask for: the core's modes, and "auto": sampled in batching mode, off in
# cache-only mode (sim.settings.SimSettings.reuse_mode decides)
SIM_REUSE_MODES = ("auto", *REUSE_MODES)
DEFAULT_SHARDS_RATE = 0.1  # keeps the sampled miss-ratio curve within 0.02 of the exact one
RESPONSE_KV = ("keep", "drop")
# Every command's and every settings class's default: a colocated vLLM keeps each response's KV in its
# prefix cache (the next turn hits it); "drop" is a disaggregated prefill instance (kvemu/options/response_kv.py)
DEFAULT_RESPONSE_KV = "keep"
# vLLM's --enable-prefix-caching, on by default as vLLM's; off: BlockPool(prefix_caching=False)
PREFIX_CACHING = ("on", "off")
DEFAULT_PREFIX_CACHING = "on"
# How a prompt is matched against the cache: "blocks" (vLLM: chained hashes of full blocks) or "radix"
# (SGLang: the longest common token prefix, in whole pages). See check_matching.
MATCHING = ("blocks", "radix")
DEFAULT_MATCHING = "blocks"
RADIX_POLICIES = ("lru",)
DEFAULT_PAGE_SIZE = 1  # SGLang's default page size


def check_choice(field: str, value: str, choices: tuple[str, ...]) -> None:
    """``value`` is one of ``choices``; else an ``InputError`` naming ``field`` and them all."""
    if value not in choices:
        raise InputError(field, f"must be one of {', '.join(choices)}, got {value!r}")


def check_matching(matching: str, policy: str, hit_mode: str, prefix_caching: str, field: str = "matching") -> None:
    """One of ``MATCHING``, and what radix matching needs.

    Radix matching (SGLang's radix tree) is built on the block pool: the hashing unit is the page
    (``block_size`` is the page size), a chain of page hashes is a path from the tree's root, a
    prompt's longest common token prefix in whole pages is the leading run of its page hashes that is
    resident, a partial last page has no hash and is never shared, and a page's reference count is
    its pin count. What a radix tree adds is the eviction rule: only leaves go. With LRU the pool's
    order already is leaf-first (a page is touched whenever a page chained after it is, a finished
    request's pages are released tail first and its response before its prompt), so LRU carries over
    exactly; policies that order by frequency, ghost lists, sessions or future use (S3-FIFO, ARC,
    session LRU, Belady, ...) can put a parent before its children, which a radix tree never evicts,
    so they are refused rather than emulated inexactly. A hit is a leading run (``prefix``): a tree
    has no holes."""
    check_choice(field, matching, MATCHING)
    if matching != "radix":
        return
    if policy not in RADIX_POLICIES:
        raise InputError("policy", f"{policy!r} can evict a page before the pages chained after it, which a radix"
                                   f" tree never does; radix matching runs with {', '.join(RADIX_POLICIES)}"
                                   f" (or use --matching blocks)")
    if hit_mode != "prefix":
        raise InputError("hit_mode", "radix matching reuses a leading run of pages only: use --hit-mode prefix"
                                     " (its default) or --matching blocks")
    if prefix_caching != "on":
        raise InputError("prefix_caching", "radix matching is prefix caching: drop --prefix-caching off")


def check_groups(cost: CostModel, k: EngineKnobs | None = None) -> None:
    """The one decision of which KV cache groups a core runs (shared/kv_groups.py): a full-attention model's one
    group, or full and sliding-window groups on a ``GroupedPool`` (cache/grouped.py: a block table per group, a
    window's passed blocks freed each step, the hit every group serves, as vLLM 0.33's hybrid manager). With
    ``k``, the knobs that cannot run with windows are refused in one line naming their flag."""
    groups = cost.model.kv_groups.groups
    if k is None or all(g.kind == FULL for g in groups):
        return
    states = any(g.kind == STATE for g in groups)  # vLLM's 'align' mode: cache/state_table.py
    why = f"{cost.model.name} has {'state' if states else 'sliding-window'} layers (KV cache groups, cache/grouped.py)"
    if states and k.speculative is not None:
        raise InputError("--speculative-method", f"{why}: speculative decoding's state blocks (vLLM's"
                                                 " num_speculative_blocks) are not modelled: drop it")
    for flag, refused, reason in (
            ("--hit-mode", k.hit_mode != "prefix", "a hit is a leading run every group serves: use --hit-mode prefix"),
            ("--prefix-caching", k.prefix_caching != "on", "groups are modelled with prefix caching on"),
            ("--no-decode-kv", not k.decode_kv, "a window frees the blocks decoding takes: drop --no-decode-kv"),
            ("--scheduler", k.scheduler != "fcfs", "reorder's loans count one group's blocks: use --scheduler fcfs"),
            ("--matching", k.matching != "blocks", "SGLang's sliding-window radix tree is not modelled: use"
                                                   " --matching blocks"),
            ("--step-rule", k.step_rule != "v1", "vLLM v0 has no hybrid KV cache manager: use --step-rule v1"),
            ("--speculative-method", k.speculative is not None and k.speculative.lookahead > 0,
             "an EAGLE or MTP drafter's prefix hit needs one window block more and drops its last (vLLM's"
             " use_eagle), not modelled: use ngram"),
            ("--host-cache-gib", k.tiers.enabled, "memory tiers below HBM are not modelled per group yet (vLLM"
                                                  " 0.33's OffloadingConnector offloads each group's blocks)")):
        if refused:
            raise InputError(flag, f"{why}: {reason}")


def check_groups_served(cost: CostModel, flag: str, what: str) -> None:
    """A sliding-window model where a way of serving it (``flag``: P/D, a real backend) cannot hold a table per
    group yet: refused in one line rather than run as full attention."""
    kinds = {g.kind for g in cost.model.kv_groups.groups}
    if kinds & {WINDOW, STATE}:
        layers = "state" if STATE in kinds else "sliding-window"
        raise InputError(flag, f"{cost.model.name} has {layers} layers (KV cache groups): {what}")


def check_prefix_caching(prefix_caching: str, tiers: TierSettings, field: str = "prefix_caching") -> None:
    """One of ``PREFIX_CACHING``; off keeps no KV across requests, so a tier below HBM would hold
    nothing: refused."""
    check_choice(field, prefix_caching, PREFIX_CACHING)
    if prefix_caching == "off" and tiers.enabled:
        raise InputError(field, "off keeps no KV across requests, so a host or SSD tier would hold nothing: drop"
                                " --host-cache-gib / --ssd-cache-gib (for HBM keeping nothing above a tier that"
                                " keeps everything, as LMCache beside vLLM without prefix caching, use"
                                " --no-hbm-caching)")


@dataclass(frozen=True, slots=True)
class EngineKnobs:
    """The knobs every process that runs a core shares, the simulator's replicas and a live replica alike: the
    one record a new scheduler or cache knob is added to (with its flag in kvemu/options and its line in
    ``kvemu.options.knobs.FLAGS``). ``SimSettings``, ``ReplicaSettings`` and ``CoreSettings`` each hold one
    (``knobs``); what a process resolves for itself (capacity, block size, the length limit, the queue bound,
    reuse tracking, events) stays in its own settings. Checked here, once; a command re-raises a refusal
    naming the flag (``kvemu.options.knobs.engine_knobs``)."""

    policy: str = "lru"
    policy_params: tuple[tuple[str, object], ...] = ()
    hit_mode: str = DEFAULT_HIT_MODE  # of pool.HIT_MODES
    matching: str = DEFAULT_MATCHING  # "blocks" or "radix" (check_matching): with radix, block_size is the page size
    token_budget: int = limits.DEFAULT_TOKEN_BUDGET  # tokens per scheduler step
    max_running: int = limits.DEFAULT_MAX_RUNNING  # requests running at once
    scheduler: str = limits.DEFAULT_ADMISSION  # admission order: fcfs (vLLM) or reorder (FlashGen)
    watermark: float = limits.DEFAULT_WATERMARK  # fraction of the pool an admission leaves free (vLLM v0's; 0: v1's)
    step_rule: str = DEFAULT_STEP_RULE  # SchedulerSettings.step_rule (v0: vLLM v0's steps)
    max_loans: int = limits.DEFAULT_MAX_LOANS  # reorder: admissions ahead of its turn one request may get
    # Decode KV takes blocks as it fills them, and preempts when none is left (vLLM); False: only prompt blocks
    # count (a one-at-a-time run then equals the cache-only replay exactly)
    decode_kv: bool = True
    # "keep": a finished request's response blocks are cached (a colocated vLLM); "drop": they are not (a
    # disaggregated prefill instance, the estimator's theoretical variant)
    response_kv: str = DEFAULT_RESPONSE_KV
    # vLLM's --enable-prefix-caching, "on" or "off". Off: no KV is kept across requests and none is shared
    # between running ones (each request's blocks are its own, freed when it ends; BlockPool.prefix_caching)
    prefix_caching: str = DEFAULT_PREFIX_CACHING
    tiers: TierSettings = TierSettings()  # host DRAM / SSD (and a shared level) below HBM; none by default
    shards_rate: float = DEFAULT_SHARDS_RATE  # SHARDS sampling of reuse distances, where they are sampled
    seed: int = 0
    # speculative decoding (replica/core/sched/spec_decode.py, checked there); None: one token a decode step
    speculative: SpecDecode | None = None

    def __post_init__(self) -> None:
        policy_class(self.policy)  # unknown names list the valid ones
        check_choice("hit_mode", self.hit_mode, HIT_MODES)
        for name in ("token_budget", "max_running", "max_loans"):
            check_positive_int(name, getattr(self, name))
        check_admission(self.scheduler)
        check_watermark(self.watermark)
        check_step_rule(self.step_rule)
        check_choice("response_kv", self.response_kv, RESPONSE_KV)
        check_number("shards_rate", self.shards_rate, above=0, maximum=1)
        check_prefix_caching(self.prefix_caching, self.tiers)
        check_matching(self.matching, self.policy, self.hit_mode, self.prefix_caching)


@dataclass(frozen=True, slots=True)
class CoreSettings:
    """What shapes one replica's core. ``reuse``: exact reuse distances (the simulator), SHARDS
    sampling at ``shards_rate`` (the live replica, bounded memory) or none. ``oracles``: allow
    offline policies that need the future (only the simulator can give it)."""

    capacity_blocks: int
    knobs: EngineKnobs = EngineKnobs()  # what every process's core shares (checked there)
    block_size: int = 16  # tokens per block; with knobs.matching "radix", per page
    max_waiting: int = limits.DEFAULT_MAX_WAITING
    max_model_len: int = 0  # vLLM's length rule, resolved (SchedulerSettings.max_model_len; 0: the pool's only)
    reuse: str = "sampled"
    shards_max_tracked: int = 1 << 16
    emit_events: bool = True
    tier_events: bool = False  # the host / SSD tiers emit events too (a live replica: its router's index)
    oracles: bool = False
    stream_tokens: bool = True  # report per-request decoded tokens each step (the live replica streams them)
    # The scheduler drives the pool's compiled twin where it is exact (replica.core.compiled.pool:
    # LRU / S3-FIFO / Belady / BeladyCompute, no events, no tiers, response KV kept only with LRU or S3-FIFO, fcfs).
    compiled: bool = False

    def __post_init__(self) -> None:
        check_choice("reuse", self.reuse, REUSE_MODES)


@dataclass(slots=True)
class ReplicaCore:
    """A replica's pure core: the pool (with its policy and metrics) and the scheduler over it.

    One way in: ``serving`` is the pool requests go to (the compiled twin where it runs, else the
    Python pool), and ``pool`` is the Python pool, always current: reading it first writes what the
    twin reached into it (``CompiledPool.settle``, a no-op when nothing changed since).
    """

    _pool: BlockPool
    scheduler: Scheduler
    tiers: TierStack | None = None
    _compiled: CompiledPool | None = None
    # why the compiled twin does not run though it was asked for (``compiled.pool.why_not``); None: it
    # runs, or the Python pool was asked for
    why_python: str | None = None
    # why a tier level below HBM runs its Python pool though the compiled twin was asked for; None: each
    # level's twin runs (or there are none, or the Python pools were asked for)
    why_python_levels: str | None = None
    # a model of several KV cache groups: its pool's keys as (hash, group), so its events are each group's
    # (cache/group_events.py); None: one group, whose keys are the hashes
    group_keys: GroupKeys | None = None

    @property
    def pool(self) -> BlockPool:
        """The Python pool, settled: what every report, event and index reads."""
        return self._compiled.settle() if self._compiled is not None else self._pool

    @property
    def serving(self) -> BlockPool | CompiledPool | GroupedPool:
        """The pool requests go to (``acquire``, ``serve``): the compiled twin where it runs, the pool of KV cache
        groups over the Python pool for a model with sliding windows."""
        if self._compiled is not None:
            return self._compiled
        pool = self.scheduler.pool
        return pool if isinstance(pool, GroupedPool) else self._pool

    @property
    def compiled(self) -> CompiledPool | None:
        """The compiled twin when it runs (its ``serve_requests`` replays a trace in one call)."""
        return self._compiled

    @property
    def engine(self) -> str:
        """``compiled``: HBM and every tier level run their compiled twins; ``python``: HBM runs the
        Python pool; ``mixed``: HBM is compiled, a tier level is not (``why_python_levels``)."""
        if self._compiled is None:
            return "python"
        return "mixed" if self.why_python_levels is not None else "compiled"

    @property
    def metrics(self) -> PoolMetrics:
        return self.pool.metrics

    def drain_events(self) -> list[KvEvent]:
        """Every level's events since the last drain: HBM's untagged, then each lower level's tagged with its index.

        An HBM ``cleared`` (an admin reset) clears every tier in an index, so the lower tiers then
        follow with what they hold now instead of their changes."""
        events = self.pool.drain_events()
        tiers = self.tiers
        if tiers is not None and tiers.emit_events:
            events += tiers.snapshot_events() if any(e.kind == "cleared" for e in events) else tiers.drain_events()
        return self.group_keys.resolve(events) if self.group_keys is not None else events

    def snapshot_events(self) -> list[KvEvent]:
        """``stored`` of every block held, per tier: what follows ``cleared`` in a resync."""
        events = [KvEvent("stored", tuple(self.pool.resident))] if self.pool.resident else []
        if self.tiers is not None and self.tiers.emit_events:
            events += self.tiers.snapshot_events()
        return self.group_keys.lookup(events) if self.group_keys is not None else events

    @property
    def capacity_with_tiers(self) -> int:
        """Blocks this replica holds at most, HBM and lower tiers together."""
        return self.pool.capacity + (self.tiers.capacity if self.tiers is not None else 0)


def _grouped(pool: BlockPool, groups: KvGroups, token_budget: int) -> GroupedPool:
    """The pool of KV cache groups over ``pool``, a window's admission cap counting a step's tokens."""
    grouped = GroupedPool(pool, groups)
    grouped.in_flight = 2 * token_budget  # vLLM's async scheduling (its default): two steps in flight
    return grouped


def _reuse_tracker(s: CoreSettings) -> ReuseDistanceTracker | ShardsTracker | None:
    if s.reuse == "exact":
        return ReuseDistanceTracker(max_distance=max(4 * s.capacity_blocks, 1 << 16))
    if s.reuse == "sampled":
        return ShardsTracker(rate=s.knobs.shards_rate, max_tracked=s.shards_max_tracked, seed=s.knobs.seed)
    return None


def build_core(s: CoreSettings, cost: CostModel, *, hashes_fit: bool = True,
               shared: SharedStore | None = None) -> ReplicaCore:
    """Metrics, policy, pool and scheduler, wired the same way wherever a replica runs.

    The metrics (CSR) and cost-aware policies share one depth-cost table from the cost model.
    ``hashes_fit``: every block hash the core will see is a 64-bit unsigned integer (the simulator
    knows its trace's); with ``s.compiled``, ``compilable`` decides whether the compiled twin runs.
    ``shared``: the store of a shared level (``s.knobs.tiers.shared``), one object for every replica it serves.
    """
    k = s.knobs
    check_groups(cost, k)
    policy = make_policy(k.policy, **dict(k.policy_params))
    if policy.needs_future and not s.oracles:
        raise InputError("policy", f"{k.policy} is an offline oracle; it runs in `kvemu sim` only")
    bs = s.block_size
    costs = DepthCosts(lambda depth: cost.block_cost(depth, bs))
    metrics = PoolMetrics(block_size=bs, block_cost=costs, bytes_per_block=cost.block_bytes(bs),
                          reuse_tracker=_reuse_tracker(s))
    pool = BlockPool(s.capacity_blocks, policy, block_size=bs, hit_mode=k.hit_mode, metrics=metrics,
                     emit_events=s.emit_events, block_cost=costs,
                     prefix_caching=k.prefix_caching == "on")
    tiers = TierStack(k.tiers, pool, cost.block_bytes(bs), costs, s.tier_events, shared) if k.tiers.enabled else None
    groups = cost.model.kv_groups
    windows = any(g.kind != FULL for g in groups.groups)  # a table per group: the Python pool (GroupedPool)
    why = why_not(pool, tiers=tiers is not None, keeps_response_kv=k.response_kv == "keep",
                  hbm_caching=k.tiers.hbm_caching, hashes_fit=hashes_fit, kv_groups=len(groups.groups)) \
        if s.compiled else None
    if why is None and s.compiled and windows:
        why = "a sliding-window model needs the Python pool (a block table per group)"
    fast = CompiledPool(pool) if s.compiled and why is None else None
    if tiers is not None and fast is not None:
        tiers.hbm_lookup = fast  # what the stack asks of HBM (missing blocks) the serving pool answers
    levels_why: list[str] = []
    if tiers is not None and s.compiled:
        def level_twin(name: str, level_pool: BlockPool) -> CompiledPool | None:
            reason = why_not(level_pool, tiers=level_pool.evicted_sink is not None, hashes_fit=hashes_fit, level=True)
            if reason is not None:
                levels_why.append(f"the {name} tier: {reason}")
            return CompiledPool(level_pool) if reason is None else None
        tiers.serve_levels_with(level_twin, KernelLevels)
    serving: SchedulerPool = fast or (_grouped(pool, groups, k.token_budget) if windows else pool)
    sched = Scheduler(serving, cost, SchedulerSettings(token_budget=k.token_budget, max_running=k.max_running,
                                                    max_waiting=s.max_waiting, admission=k.scheduler,
                                                    decode_kv=k.decode_kv, max_model_len=s.max_model_len,
                                                    watermark=k.watermark, max_loans=k.max_loans,
                                                    step_rule=k.step_rule, speculative=k.speculative),
                      report_decoded=s.stream_tokens, tiers=tiers, keep_response_kv=k.response_kv == "keep")
    return ReplicaCore(pool, sched, tiers, fast, why, levels_why[0] if levels_why else None,
                       GroupKeys(groups, max(1 << 17, 4 * s.capacity_blocks)) if groups.hybrid and s.emit_events
                       else None)
