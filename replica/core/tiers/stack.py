"""The KV memory hierarchy below HBM (FlashGen, Jeong and Ahn, ASPLOS 2025): host DRAM and SSD tiers.

Pure and synchronous, like the pool. The hierarchy is an ordered list of levels, HBM first
(level 0); each level below is a ``BlockPool`` of its own (capacity and any registered eviction
policy; nothing is pinned there), so residency, ordering and eviction are the same code as in
HBM. The kinds of level (host DRAM, SSD, ...) and what differs between them are in
``levels.py``; this module treats every level alike. The HBM pool tells the stack what it evicts
(``BlockPool.evicted_sink``); the scheduler asks the stack, when it admits a request, which of
the blocks missing from HBM a lower level holds and whether to fetch or recompute them.

* ``exclusive``: a block lives in one level. HBM evictions are demoted to the first level
  present (a write over the device-to-host link), each level's evictions to the next one (a
  write on that level's link), the last level's are dropped; a fetched block leaves its level
  (it is in HBM again).
* ``inclusive`` (FlashGen): each block is copied to the first level as it is produced, so
  freeing HBM costs nothing; evictions spill down as above; a fetched block stays where it was.

Fetch or recompute (``fetch``): ``always`` restores every block a tier holds, ``never``
recomputes them, ``auto`` decides per run of consecutive missing blocks in one tier: fetch
when the run's transfer time is below its recompute time at its depth (the cost model's
per-block cost), as FlashGen's opportunistic recompute does.

Transfers share their link (``link.Link``, the one link model: processor sharing, ``n`` transfers
in flight each at ``1/n`` of its bandwidth), so two fetches share it and write-back to SSD slows SSD
reads. Every move into or out of HBM crosses the device link (``h2d`` / ``d2h``, host memory's
link): restores, demotions, inclusive copies, a finished request's move down without HBM caching,
and, on GPUs whose tensor-parallel all-reduce crosses PCIe (``tp_bytes_per_token``), every step's
all-reduce (``all_reduce``: the step's communication takes what its share of the link gives it).
A level behind host memory (SSD) has its own link; its reads are staged from the request's arrival
while it waits (``stage``, at submit). A restore is pipelined layer by layer with the request's
prefill compute: the scheduler charges the larger of the two, not their sum, with the transfers'
ends projected when the step runs (``windows``).

A backend that holds real K/V (``replica --backend torch``) sets ``copies``: the stack tells it
every block it moves (``TierCopies.copy(src, dst, hashes)``, levels by name: ``hbm``, ``host``,
``ssd``, ...) at the moment it decides, after the evictions that make room for them, so the backend
executes the same moves in the same order; the decisions stay here.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Protocol, cast

from replica.core.cache.costs import DepthCosts
from replica.core.cache.policies import make_policy, policy_class
from replica.core.cache.pool import Allocation, BlockPool, KvEvent
from replica.core.cache.types import Lookup
from replica.core.tiers.levels import SSD_READ_GBPS, SSD_WRITE_GBPS, Level, LevelPool, LevelSettings, level_kind
from replica.core.tiers.link import Link, Transfer
from replica.core.tiers.shared import SharedLevel, SharedSettings, SharedStore
from shared.errors import InputError
from shared.index.base import level_key, lower_run_counts
from shared.validate import check_number

TIER_MODES = ("inclusive", "exclusive")
FETCH_MODES = ("always", "never", "auto")
GB = 1e9

# The host link's bandwidth and per-copy cost come from the GPU preset (shared.costmodel:
# ``GpuSpec.host_bandwidth``, ``host_copy_overhead_s``, measured on an H200); kvemu.options.tiers
# passes them.


@dataclass(frozen=True, slots=True)
class TierSettings:
    """The hierarchy below HBM; capacities in blocks (0: no such level).

    Host DRAM and SSD, the levels the flags set, have their fields here; ``deeper`` lists the
    levels below SSD, in order. ``levels()`` is the ordered list the stack builds."""

    host_blocks: int = 0
    ssd_blocks: int = 0
    host_policy: str = "lru"
    ssd_policy: str = "lru"
    mode: str = "exclusive"
    fetch: str = "auto"
    host_link_gbps: float = 55.5  # per direction; kvemu.options.tiers takes the GPU preset's
    host_copy_overhead_s: float = 0.0  # per block copied over the host link
    ssd_read_gbps: float = SSD_READ_GBPS
    ssd_write_gbps: float = SSD_WRITE_GBPS
    # False (CachedAttention): HBM keeps no KV between requests; a finished request's blocks
    # move down at once and the next turn restores them. True: HBM is the first cache level.
    hbm_caching: bool = True
    deeper: tuple[LevelSettings, ...] = ()  # levels below SSD (level 3 first)
    # A tensor-parallel all-reduce over PCIe (no NVLink): bytes each direction of the device link
    # carries per token of a step, and the seconds per token the cost model priced it at alone
    # (0: the all-reduce has a link of its own, or there is none).
    tp_bytes_per_token: float = 0.0
    tp_comm_s_per_token: float = 0.0
    # The store the cluster's replicas share, the last level (replica/core/tiers/shared.py); None: none
    shared: SharedSettings | None = None

    def __post_init__(self) -> None:
        for name in ("host_blocks", "ssd_blocks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InputError(name, f"must be an integer >= 0, got {value!r}")
        if self.mode not in TIER_MODES:
            raise InputError("tier_mode", f"must be one of {', '.join(TIER_MODES)}, got {self.mode!r}")
        if self.fetch not in FETCH_MODES:
            raise InputError("fetch", f"must be one of {', '.join(FETCH_MODES)}, got {self.fetch!r}")
        for name in ("host_link_gbps", "ssd_read_gbps", "ssd_write_gbps"):
            check_number(name, getattr(self, name), above=0)
        for name in ("tp_bytes_per_token", "tp_comm_s_per_token"):
            check_number(name, getattr(self, name), minimum=0)
        if any(level.kind == "shared" for level in self.deeper):
            raise InputError("deeper", "the shared level is set by TierSettings.shared (it is the last level)")
        if any(level_kind(level.kind).host_memory for level in self.deeper):
            raise InputError("deeper", "host memory is level 1 and only level 1 (the device link's other end)")
        for level in self.levels():
            if policy_class(level.policy).needs_future:
                raise InputError("tier_policy", f"{level.policy} is an offline oracle; a tier needs an online policy")

    def levels(self) -> tuple[LevelSettings, ...]:
        """Every level below HBM in order, level 1 first (host DRAM, SSD, then ``deeper``)."""
        return (LevelSettings("host", self.host_blocks, self.host_policy, self.host_link_gbps, self.host_link_gbps,
                              self.host_copy_overhead_s),
                LevelSettings("ssd", self.ssd_blocks, self.ssd_policy, self.ssd_read_gbps, self.ssd_write_gbps),
                *self.deeper,
                *((LevelSettings("shared", self.shared.blocks, "lru", self.shared.nic_gbps / 8, self.shared.nic_gbps / 8,
                                 latency_s=self.shared.ttfb_s),) if self.shared is not None else ()))

    @property
    def enabled(self) -> bool:
        return any(level.blocks > 0 for level in self.levels())


class MissingBlocks(Protocol):
    def missing(self, hashes: Sequence[int]) -> list[int]: ...


class TierCopies(Protocol):
    """Executes the stack's moves on real K/V (``replica/backends/torch_tiers.py``)."""

    def copy(self, src: str, dst: str, hashes: Sequence[int]) -> None: ...


@dataclass(slots=True)
class FetchPlan:
    """What one admitted request restores from lower tiers."""

    restored_idx: list[int] = field(default_factory=list)  # depths fetched (ascending)
    ready_at: float = 0.0  # when the last restore transfer ends, projected at plan (0: nothing to wait for)
    started_at: float = 0.0  # when the first copy into HBM starts (its layers arrive from then to ready_at)
    recomputed: int = 0  # blocks a tier holds that are cheaper to recompute
    started: list[tuple[Link, Transfer]] = field(default_factory=list)  # transfers the plan started
    waits: list[tuple[Link, Transfer]] = field(default_factory=list)  # every transfer the restore waits on
    staged: dict[int, tuple[Link, Transfer]] = field(default_factory=dict)  # staged reads it took (cancel: back)
    pins: list[tuple[Level, Allocation]] = field(default_factory=list)  # held in their level until complete


@dataclass(slots=True)
class TierCounters:
    accessed_blocks: int = 0  # blocks of admitted requests
    # per level: hits[0] reused in HBM, hits[k] restored from level k
    hits: list[int] = field(default_factory=list)
    recomputed: int = 0  # held by a lower tier but recomputed (fetch decision)
    demoted: int = 0
    dropped: int = 0  # fell off the last tier

    @classmethod
    def of(cls, levels: int) -> TierCounters:
        """Counters of HBM and ``levels`` levels below it."""
        return cls(hits=[0] * (levels + 1))

    @property
    def hbm_hits(self) -> int:
        return self.hits[0]

    @property
    def fetched(self) -> int:
        """Blocks restored from every level below HBM."""
        return sum(self.hits[1:])


class LevelQueries(Protocol):
    """What the stack asks of all its levels at once, level positions in the stack's order."""

    def runs(self, hashes: Sequence[int], depths: Sequence[int]) -> list[tuple[int, int, int]]:
        """(level position, first depth, end depth): runs of consecutive ``depths`` (ascending) whose
        blocks one level holds, the upper level that holds a block taking it."""
        ...

    def lower_counts(self, hashes: Sequence[int], start: int) -> list[int]:
        """The run of ``hashes`` from ``start`` some level holds: its blocks per level (the upper first)."""
        ...


class HeldLevels:
    """``LevelQueries`` over the levels' membership (``Level.held``): the definition, in Python.
    ``replica.core.compiled.pool.KernelLevels`` answers the same in C where every level is compiled."""

    __slots__ = ("held",)

    def __init__(self, held: Sequence[Container[int]]) -> None:
        self.held = held

    def runs(self, hashes: Sequence[int], depths: Sequence[int]) -> list[tuple[int, int, int]]:
        runs: list[tuple[int, int, int]] = []
        held = self.held
        for i in depths:
            h = hashes[i]
            k = next((k for k, level in enumerate(held) if h in level), -1)  # the upper level holding it
            if k < 0:
                continue
            if runs and runs[-1][0] == k and runs[-1][2] == i:
                runs[-1] = (k, runs[-1][1], i + 1)
            else:
                runs.append((k, i, i + 1))
        return runs

    def lower_counts(self, hashes: Sequence[int], start: int) -> list[int]:
        return lower_run_counts(hashes, start, self.held)  # the one definition (indexes use it too)


class TierStack:
    """The levels below one HBM pool; see the module docstring."""

    def __init__(self, settings: TierSettings, hbm: BlockPool, block_bytes: int,
                 recompute_cost: Callable[[int], float], emit_events: bool = False,
                 shared: SharedStore | None = None) -> None:
        self.settings = settings
        self.emit_events = emit_events  # the tier pools' stored / removed events, for a router's index
        self.hbm = hbm
        # what plan asks of HBM (the blocks it lacks): the pool itself, or its compiled twin serving
        self.hbm_lookup: MissingBlocks = hbm
        self.block_bytes = block_bytes
        # a run's recompute cost is a difference of prefix sums (cached per depth, as the metrics' are)
        self.costs = recompute_cost if isinstance(recompute_cost, DepthCosts) else DepthCosts(recompute_cost)
        configured = settings.levels()
        self.counters = TierCounters.of(len(configured))
        # The device link: host memory <-> HBM, per direction; every move into or out of HBM crosses it.
        host = configured[0]
        gbps, per_copy = host.read * GB, host.per_copy_s
        self.h2d = Link("host_to_device", gbps, per_copy)
        self.d2h = Link("device_to_host", gbps, per_copy)
        self.names = [lv.kind for lv in configured]  # level k is names[k - 1]
        # One link per level behind host memory (one drive: its writes compete with its reads); a
        # level configured without capacity keeps its link, so every link is reported (0 bytes).
        self._links = {lv.kind: Link(lv.kind, lv.read * GB, lv.per_copy_s, lv.latency_s)
                       for lv in configured if not level_kind(lv.kind).host_memory}
        # The levels that hold blocks, in order: where demotions go.
        self.levels = [self._level(k, lv, emit_events, shared) for k, lv in enumerate(configured, 1) if lv.blocks > 0]
        self._now = 0.0
        # reads staged from SSD (or any level behind host memory) for waiting requests, by block hash
        self._staged: dict[int, tuple[Link, Transfer]] = {}
        self.copies: TierCopies | None = None  # a backend with real K/V executes the moves
        hbm.evicted_sink = self._hbm_evicted
        for k, level in enumerate(self.levels):
            level.spill_into(self._spiller(level, self.levels[k + 1] if k + 1 < len(self.levels) else None))
        self._through = [level for level in self.levels if level.writes_through]  # written as requests finish
        self.queries: LevelQueries = HeldLevels([lv.held for lv in self.levels])

    def _level(self, k: int, lv: LevelSettings, emit_events: bool, shared: SharedStore | None) -> Level:
        link = self._links.get(lv.kind)
        if not level_kind(lv.kind).given:
            return Level(k, lv.kind, BlockPool(lv.blocks, make_policy(lv.policy), emit_events=emit_events), link,
                         lv.write * GB)
        if shared is None or self.settings.shared is None:
            raise InputError("shared", "a shared level needs its store: the simulator or the store service gives it")
        return SharedLevel(k, lv.kind, cast(LevelPool, shared), link, lv.write * GB, shared.link, self.settings.shared)

    @property
    def shared(self) -> Level | None:
        """The shared store's level, where there is one (always the last)."""
        return self.levels[-1] if self.levels and self.levels[-1].shared else None

    def serve_levels_with(self, twin: Callable[[str, BlockPool], LevelPool | None],
                          queries: Callable[[list], LevelQueries]) -> None:
        """Put each level's compiled twin in its pool's place where ``twin`` makes one (the simulator's
        fast path; ``twin`` returns None where it would not be exact, and says why to whom it may);
        where every level has one, ``queries`` of their list answers the stack's ``LevelQueries``."""
        twins = []
        for level in self.levels:
            fast = level.serve_with(twin)
            if fast is not None:
                twins.append(fast)
        self.queries = queries(twins) if twins and len(twins) == len(self.levels) \
            else HeldLevels([lv.held for lv in self.levels])

    def level(self, name: str) -> Level | None:
        """The level of that name (``"host"``, ``"ssd"``, ...); None: it holds no blocks."""
        return next((lv for lv in self.levels if lv.name == name), None)

    def pool(self, name: str) -> BlockPool | None:
        """The block pool of the level of that name; None: it holds no blocks."""
        level = self.level(name)
        return None if level is None else level.pool

    def links(self) -> list[Link]:
        """Every link, the device link's two directions first."""
        return [self.h2d, self.d2h, *self._links.values()]

    # ---- events (a router's index learns what each level holds) ---------------------
    def drain_events(self) -> list[KvEvent]:
        """The level pools' ``stored`` / ``removed`` events since the last drain, tagged with their level index."""
        return [e for lv in self.levels for e in lv.drain_events()]

    def snapshot_events(self) -> list[KvEvent]:
        """``stored`` of every block each level holds (a resync), dropping the events not yet drained."""
        return [e for lv in self.levels for e in lv.snapshot_events()]

    @property
    def capacity(self) -> int:
        """Blocks the lower levels hold at most."""
        return sum(lv.serving.capacity for lv in self.levels)

    # ---- flows down ---------------------------------------------------------------
    def produced(self, hashes: Sequence[int], now: float) -> None:
        """Blocks just computed into HBM: inclusive mode copies them to the first level at once."""
        self._now = max(self._now, now)
        if self.settings.mode == "inclusive" and hashes and self.levels:
            self._store(self.levels[0], hashes, "hbm")

    def _hbm_evicted(self, victims: Sequence[int]) -> None:
        if self.settings.mode == "exclusive" and victims:
            if not self.levels or self.levels[0].writes_through:
                self.counters.dropped += len(victims)
                return
            self.counters.demoted += len(victims)
            self._store(self.levels[0], victims, "hbm")

    def _spiller(self, level: Level, below: Level | None) -> Callable[[Sequence[int]], None]:
        """A level's eviction sink: on to the level below, or out of the hierarchy from the last."""
        def spill(victims: Sequence[int]) -> None:
            if below is None or below.writes_through:
                self.counters.dropped += len(victims)
            else:
                self._store(below, victims, level.name)
        return spill

    def released(self, hashes: Sequence[int], stored: Sequence[int], now: float) -> None:
        """A request finished (its prompt's ``hashes``, then the response blocks it ``stored``). Without
        HBM caching its blocks no other request holds leave HBM for the tiers below (written down
        first in exclusive mode)."""
        for level in self._through:  # a level written through (the shared store's 'through'): what it computed
            self._now = max(self._now, now)
            self._store(level, level.through(hashes, stored), "hbm")
        if self.settings.hbm_caching:  # the default: nothing to do, so nothing joined
            return
        self._now = max(self._now, now)
        hbm = self.hbm
        gone = [h for h in chain(hashes, stored) if h in hbm.resident and not hbm.is_pinned(h)]
        if self.settings.mode == "exclusive":
            self._hbm_evicted(gone)
        hbm.remove(gone)

    def _store(self, level: Level, hashes: Sequence[int], src: str) -> None:
        """Copy blocks from level ``src`` into a level (those it holds already just count as used)."""
        tier, held = level.serving, level.held
        room = tier.capacity - tier.pinned  # blocks held for a pending fetch stay
        # what fits is written in; its evictions move down first (their copies and their link's
        # transfers too: a lower level's link is never this level's, so the order of the two is free)
        new = tier.admit_absent(hashes, self._now)
        if not new:
            return
        nbytes = len(new) * self.block_bytes
        levels = self.levels
        if level is levels[0]:  # from HBM (through host memory when there is no host level)
            self.d2h.start(self._now, nbytes, copies=len(new))
        level.write(self._now, nbytes)
        if room > 0 and self.copies is not None:
            self.copies.copy(src, level.name, [h for h in new[:room] if h in held])
        if len(new) > room:  # no room even after evicting: on to the next level, or gone
            k = levels.index(level)
            if k + 1 < len(levels):
                self._store(levels[k + 1], new[room:], src)
            else:
                self.counters.dropped += len(new) - room

    # ---- flows up -----------------------------------------------------------------
    def stage(self, hashes: Sequence[int], now: float) -> None:
        """A request entered the queue: the blocks missing from HBM that a level behind host memory
        (SSD) holds start their read now, while it waits (FlashGen's pre-staging). ``plan`` takes the
        staged reads; a block staged for another waiting request is not read twice."""
        levels, staged = self.levels, self._staged
        if not any(lv.link is not None for lv in levels):
            return
        self._now = max(self._now, now)
        for k, first, end in self.queries.runs(hashes, self.hbm_lookup.missing(hashes)):
            link = levels[k].staged_link
            if link is None:
                continue
            todo = [h for h in hashes[first:end] if h not in staged]
            if todo:
                tr = link.start(self._now, len(todo) * self.block_bytes)
                for h in todo:
                    staged[h] = (link, tr)
        if len(staged) > 4 * max(self.capacity, 1):  # requests that left without admission: forget their reads
            self._staged = {h: lt for h, lt in staged.items() if lt[1].end < 0 or lt[1].end > self._now}

    def plan(self, hashes: Sequence[int], now: float) -> FetchPlan:
        """Before HBM allocates a request: which of its blocks missing from HBM to restore.

        Those blocks are pinned in their tier until ``complete`` (or ``cancel``), so the
        demotions the allocation causes cannot push them out first. SSD blocks staged while the
        request waited (``stage``) count only the part of their read still to come; every transfer
        is priced with those in flight on its link.
        """
        self._now = max(self._now, now)
        plan = FetchPlan(started_at=self._now)
        levels, staged = self.levels, self._staged
        for h in hashes:  # this request's staged reads are its own now (given back on cancel)
            got = staged.pop(h, None)
            if got is not None:
                plan.staged[h] = got
        for k, first, end in self.queries.runs(hashes, self.hbm_lookup.missing(hashes)):
            level = levels[k]
            run = hashes[first:end]
            reads = [plan.staged[h] for h in run if h in plan.staged] if level.link is not None else []
            if self._worth_fetching(level, first, end, reads):
                plan.restored_idx.extend(range(first, end))
                plan.pins.append((level, level.serving.acquire(Lookup(run, now=now))))
                self._transfer_up(plan, level, run, reads)
            else:
                plan.recomputed += end - first
        plan.restored_idx.sort()
        plan.ready_at = max((link.finish(tr) for link, tr in plan.waits), default=0.0)
        return plan

    def cancel(self, plan: FetchPlan) -> None:
        """The allocation failed (HBM busy, nothing evicted): unpin and take back the transfers it
        started (at the same instant: nothing has moved); it will plan again."""
        for level, alloc in plan.pins:
            level.serving.release(alloc, self._now)
        for link, tr in plan.started:
            link.cancel(tr)
        self._staged.update(plan.staged)
        plan.pins.clear()
        plan.started.clear()
        plan.waits.clear()
        plan.staged.clear()

    def windows(self, plans: Sequence[FetchPlan], now: float) -> list[tuple[float, float]]:
        """Each restore's (start, ready), seconds from ``now``, projected from the transfers in flight
        now (transfers started since the plan, a step's all-reduce among them, share its links)."""
        out = []
        for plan in plans:
            ready = max((link.finish(tr) for link, tr in plan.waits), default=0.0)
            if ready > now:
                out.append((plan.started_at - now, ready - now))
        return out

    def all_reduce(self, now: float, seconds: float, tokens: int) -> float:
        """A step of ``seconds`` (its all-reduce of ``tokens`` tokens priced alone) whose tensor-parallel
        all-reduce crosses the device link (PCIe, no NVLink): it sends and receives, so it shares both
        directions with the transfers in flight there; the step takes the all-reduce's time under that
        sharing instead of its time alone."""
        s = self.settings
        if not s.tp_bytes_per_token or tokens <= 0:
            return seconds
        nbytes = int(tokens * s.tp_bytes_per_token)
        up, down = self.h2d.start(now, nbytes), self.d2h.start(now, nbytes)
        alone = tokens * s.tp_comm_s_per_token
        return seconds - alone + max(self.h2d.finish(up), self.d2h.finish(down), now + alone) - now

    def complete(self, plan: FetchPlan, hashes: Sequence[int], hit_idx: Sequence[int],
                 new_idx: Sequence[int], now: float, record: bool = True) -> None:
        """After HBM allocated the request: transfers, counters (unless ``record`` is False: a
        preempted request's re-admission), copies down."""
        c = self.counters if record else TierCounters.of(len(self.names))
        c.accessed_blocks += len(hashes)
        c.hits[0] += len(hit_idx)
        c.recomputed += plan.recomputed
        for level, alloc in plan.pins:
            blocks = list(alloc.hashes)
            if self.copies is not None:  # into the HBM blocks the allocation gave them
                self.copies.copy(level.name, "hbm", blocks)
            c.hits[level.index] += len(blocks)
            level.serving.release(alloc, now)
            if self.settings.mode == "exclusive":
                level.serving.remove(blocks)  # it lives in HBM now
        plan.pins.clear()
        if self.settings.mode == "inclusive":  # copied down as computed (produced does nothing otherwise)
            restored = set(plan.restored_idx)
            self.produced([hashes[i] for i in new_idx if i not in restored], now)

    def _transfer_up(self, plan: FetchPlan, level: Level, run: Sequence[int], reads: list[tuple[Link, Transfer]]) -> None:
        """Start a run's restore: from host memory over the device link; from a level behind it, the
        read of what was not staged (the staged reads go on), and the copy into HBM beside it
        (pipelined: the restore is ready when the later of the two ends)."""
        nbytes = len(run) * self.block_bytes
        links = level.read_links()
        if links:
            unstaged = sum(1 for h in run if h not in plan.staged)
            if unstaged:
                for link in links:
                    tr = link.start(self._now, unstaged * self.block_bytes)
                    plan.started.append((link, tr))
                    plan.waits.append((link, tr))
            plan.waits.extend(reads)
        tr = self.h2d.start(self._now, nbytes, copies=len(run))
        plan.started.append((self.h2d, tr))
        plan.waits.append((self.h2d, tr))

    def transfer_seconds(self, level: Level, blocks: int, reads: Sequence[tuple[Link, Transfer]] = (),
                         unstaged: int | None = None) -> float:
        """Seconds a restore of ``blocks`` started now would take with the transfers in flight on its
        links: the device link's copy, and from a level behind host memory the later of that and the
        read (the staged ``reads`` still to come, and a read of ``unstaged`` blocks, default all)."""
        now, bb = self._now, self.block_bytes
        host = self.h2d.estimate(now, blocks * bb, copies=blocks)
        links = level.read_links()
        if not links:
            return host
        todo = blocks if unstaged is None else unstaged
        read = max(link.estimate(now, todo * bb) for link in links) if todo else 0.0
        staged = max((link.finish(tr) - now for link, tr in reads), default=0.0)
        return max(read, staged, host)

    def _worth_fetching(self, level: Level, first: int, end: int, reads: list[tuple[Link, Transfer]]) -> bool:
        """Whether to restore the run of depths [first, end) from ``level``: its transfer against its
        recompute (a difference of the per-depth costs' prefix sums, as the metrics' CSR adds them)."""
        fetch = self.settings.fetch
        if fetch != "auto":
            return fetch == "always"
        costs = self.costs
        unstaged = end - first - len(reads)
        return self.transfer_seconds(level, end - first, reads, unstaged) < costs.total(end) - costs.total(first)

    def lower_overlap(self, replica_id: str, hashes: Sequence[int], hbm_prefix: int) -> dict[str, int]:
        """For a router: the run of blocks after the HBM prefix that the lower levels hold, per level
        (what an index fed this replica's level events answers; zero counts omitted)."""
        levels = self.levels
        # the run is empty unless a level holds the block after the HBM prefix: most replicas of a
        # cluster hold nothing of a given session, and the router asks every one of them
        if hbm_prefix >= len(hashes) or not any(hashes[hbm_prefix] in lv.held for lv in levels):
            return {}
        counts = self.queries.lower_counts(hashes, hbm_prefix)
        return {level_key(replica_id, lv.index): n for lv, n in zip(levels, counts) if n}

    # ---- reporting ------------------------------------------------------------------
    def stats(self) -> dict:
        c = self.counters
        n = c.accessed_blocks or 1
        out: dict = {"mode": self.settings.mode, "fetch": self.settings.fetch, "accessed_blocks": c.accessed_blocks,
                     "hbm_block_hit_ratio": c.hbm_hits / n}
        for k, name in enumerate(self.names, 1):  # every configured level, present or not
            out[f"{name}_block_hit_ratio"] = c.hits[k] / n
        out.update({
            "fetched_blocks": c.fetched, "recomputed_from_tier_blocks": c.recomputed, "demoted_blocks": c.demoted,
            "dropped_blocks": c.dropped, "bytes_moved": {link.name: link.bytes_moved for link in self.links()},
        })
        for lv in self.levels:
            lv.report(out)
        return out
