"""The KV memory hierarchy below HBM (FlashGen, seed 001): host DRAM and SSD tiers.

Pure and synchronous, like the pool. Each lower tier is a ``BlockPool`` of its own (capacity
and any registered eviction policy; nothing is pinned there), so residency, ordering and
eviction are the same code as in HBM. The HBM pool tells the stack what it evicts
(``BlockPool.evicted_sink``); the scheduler asks the stack, when it admits a request, which of
the blocks missing from HBM a lower tier holds and whether to fetch or recompute them.

* ``exclusive``: a block lives in one tier. HBM evictions are demoted to host (a write over
  the device-to-host link), host evictions to SSD (an SSD write), SSD evictions are dropped; a
  fetched block leaves its tier (it is in HBM again).
* ``inclusive`` (FlashGen): each block is copied to host as it is produced, so freeing HBM
  costs nothing; host evictions spill to SSD; a fetched block stays where it was.

Fetch or recompute (``fetch``): ``always`` restores every block a tier holds, ``never``
recomputes them, ``auto`` decides per run of consecutive missing blocks in one tier: fetch
when the run's transfer time is below its recompute time at its depth (the cost model's
per-block cost), as FlashGen's opportunistic recompute does.

Transfers queue on their link (``Link``: busy until the last reserved transfer ends), so two
fetches share its bandwidth and write-back to SSD competes with SSD reads. A restore is
pipelined layer by layer with the request's prefill compute: the scheduler charges the larger
of the two, not their sum.

A backend that holds real K/V (``replica --backend torch``) sets ``copies``: the stack tells it
every block it moves (``TierCopies.copy(src, dst, hashes)``, tiers named ``hbm``, ``host``,
``ssd``) at the moment it decides, after the evictions that make room for them, so the backend
executes the same moves in the same order; the decisions stay here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from replica.core.cache.policies import make_policy, policy_class
from replica.core.cache.pool import Allocation, BlockPool, KvEvent
from shared.errors import InputError
from shared.index.base import lower_overlap
from shared.validate import check_number

TIER_MODES = ("inclusive", "exclusive")
FETCH_MODES = ("always", "never", "auto")
GB = 1e9

# The host link's bandwidth and per-copy cost come from the GPU preset (shared.costmodel:
# ``GpuSpec.host_bandwidth``, ``host_copy_overhead_s``, measured on an H200); tier_args passes them.
SSD_READ_GBPS = 7.0  # one PCIe 4.0 NVMe drive, sequential read
SSD_WRITE_GBPS = 5.0


@dataclass(frozen=True, slots=True)
class TierSettings:
    """The hierarchy below HBM; capacities in blocks (0: no such tier)."""

    host_blocks: int = 0
    ssd_blocks: int = 0
    host_policy: str = "lru"
    ssd_policy: str = "lru"
    mode: str = "exclusive"
    fetch: str = "auto"
    host_link_gbps: float = 55.5  # per direction; tier_args takes the GPU preset's
    host_copy_overhead_s: float = 0.0  # per block copied over the host link
    ssd_read_gbps: float = SSD_READ_GBPS
    ssd_write_gbps: float = SSD_WRITE_GBPS
    # False (CachedAttention): HBM keeps no KV between requests; a finished request's blocks
    # move down at once and the next turn restores them. True: HBM is the first cache level.
    hbm_caching: bool = True

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
        for policy in (self.host_policy, self.ssd_policy):
            if policy_class(policy).needs_future:
                raise InputError("tier_policy", f"{policy} is an offline oracle; a tier needs an online policy")

    @property
    def enabled(self) -> bool:
        return self.host_blocks > 0 or self.ssd_blocks > 0


class TierCopies(Protocol):
    """Executes the stack's moves on real K/V (``replica/backends/torch_tiers.py``)."""

    def copy(self, src: str, dst: str, hashes: Sequence[int]) -> None: ...


@dataclass(slots=True)
class Link:
    """One direction of one link: transfers queue, each at the full bandwidth."""

    name: str
    bandwidth: float  # bytes/s
    per_copy_s: float = 0.0  # each copy call's fixed cost (a block is one call: blocks are scattered)
    busy_until: float = 0.0
    bytes_moved: int = 0

    def reserve(self, now: float, nbytes: int, bandwidth: float | None = None, copies: int = 0) -> float:
        """Queue a transfer of ``nbytes`` in ``copies`` calls at ``now`` (at ``bandwidth`` if this one
        differs, e.g. an SSD write); returns the time it ends."""
        start = max(now, self.busy_until)
        self.busy_until = start + nbytes / (bandwidth or self.bandwidth) + copies * self.per_copy_s
        self.bytes_moved += nbytes
        return self.busy_until


@dataclass(slots=True)
class FetchPlan:
    """What one admitted request restores from lower tiers."""

    restored_idx: list[int] = field(default_factory=list)  # depths fetched (ascending)
    ready_at: float = 0.0  # when the last restore transfer ends (0: nothing to wait for)
    started_at: float = 0.0  # when the first copy into HBM starts (its layers arrive from then to ready_at)
    recomputed: int = 0  # blocks a tier holds that are cheaper to recompute
    arrival: float = 0.0  # when the request arrived: SSD staging starts then
    links: list[tuple[Link, float, int]] = field(default_factory=list)  # (link, busy_until, bytes) before it
    pins: list[tuple[BlockPool, Allocation]] = field(default_factory=list)  # held in their tier until complete


@dataclass(slots=True)
class TierCounters:
    accessed_blocks: int = 0  # blocks of admitted requests
    hbm_hits: int = 0
    host_hits: int = 0  # restored from host
    ssd_hits: int = 0  # restored from SSD
    recomputed: int = 0  # held by a lower tier but recomputed (fetch decision)
    demoted: int = 0
    dropped: int = 0  # fell off the last tier


class TierStack:
    """Host and SSD tiers under one HBM pool; see the module docstring."""

    def __init__(self, settings: TierSettings, hbm: BlockPool, block_bytes: int,
                 recompute_cost: Callable[[int], float], emit_events: bool = False) -> None:
        self.settings = settings
        self.emit_events = emit_events  # the tier pools' stored / removed events, for a router's index
        self.hbm = hbm
        self.block_bytes = block_bytes
        self.recompute_cost = recompute_cost
        self.counters = TierCounters()
        self.host = self._tier(settings.host_blocks, settings.host_policy, emit_events)
        self.ssd = self._tier(settings.ssd_blocks, settings.ssd_policy, emit_events)
        gbps, per_copy = settings.host_link_gbps * GB, settings.host_copy_overhead_s
        self.h2d = Link("host_to_device", gbps, per_copy)
        self.d2h = Link("device_to_host", gbps, per_copy)
        self.ssd_link = Link("ssd", settings.ssd_read_gbps * GB)  # one drive: writes compete with reads
        self._ssd_write_bw = settings.ssd_write_gbps * GB
        self._now = 0.0
        self.copies: TierCopies | None = None  # a backend with real K/V executes the moves
        hbm.evicted_sink = self._hbm_evicted
        if self.host is not None:
            self.host.evicted_sink = self._host_evicted
        if self.ssd is not None:
            self.ssd.evicted_sink = self._ssd_evicted

    @staticmethod
    def _tier(blocks: int, policy: str, emit_events: bool) -> BlockPool | None:
        if blocks <= 0:
            return None
        return BlockPool(blocks, make_policy(policy), emit_events=emit_events)

    def _named(self) -> list[tuple[str, BlockPool]]:
        return [(name, tier) for name, tier in (("host", self.host), ("ssd", self.ssd)) if tier is not None]

    # ---- events (a router's index learns what each tier holds) ----------------------
    def drain_events(self) -> list[KvEvent]:
        """The tier pools' ``stored`` / ``removed`` events since the last drain, tagged with their tier."""
        return [KvEvent(e.kind, e.hashes, name) for name, tier in self._named() for e in tier.drain_events()]

    def snapshot_events(self) -> list[KvEvent]:
        """``stored`` of every block each tier holds (a resync), dropping the events not yet drained."""
        out = []
        for name, tier in self._named():
            tier.drain_events()
            if tier.resident:
                out.append(KvEvent("stored", tuple(tier.resident), name))
        return out

    @property
    def capacity(self) -> int:
        """Blocks the lower tiers hold at most."""
        return sum(tier.capacity for _, tier in self._named())

    # ---- flows down ---------------------------------------------------------------
    def produced(self, hashes: Sequence[int], now: float) -> None:
        """Blocks just computed into HBM: inclusive mode copies them to host at once."""
        self._now = max(self._now, now)
        if self.settings.mode == "inclusive" and hashes:
            target = self.host if self.host is not None else self.ssd
            if target is not None:
                self._store(target, hashes, "hbm")

    def _hbm_evicted(self, victims: Sequence[int]) -> None:
        if self.settings.mode == "exclusive" and victims:
            target = self.host if self.host is not None else self.ssd
            if target is None:
                self.counters.dropped += len(victims)
                return
            self.counters.demoted += len(victims)
            self._store(target, victims, "hbm")

    def _host_evicted(self, victims: Sequence[int]) -> None:
        if self.ssd is None:
            self.counters.dropped += len(victims)
            return
        self._store(self.ssd, victims, "host")

    def released(self, hashes: Sequence[int], now: float) -> None:
        """A request finished. Without HBM caching its blocks no other request holds leave HBM
        for the tiers below (written down first in exclusive mode)."""
        if self.settings.hbm_caching:
            return
        self._now = max(self._now, now)
        hbm = self.hbm
        gone = [h for h in hashes if h in hbm.resident and not hbm.is_pinned(h)]
        if self.settings.mode == "exclusive":
            self._hbm_evicted(gone)
        hbm.remove(gone)

    def _ssd_evicted(self, victims: Sequence[int]) -> None:
        self.counters.dropped += len(victims)  # the last tier: they leave the hierarchy

    def _name(self, tier: BlockPool) -> str:
        return "host" if tier is self.host else "ssd"

    def _store(self, tier: BlockPool, hashes: Sequence[int], src: str) -> None:
        """Copy blocks from tier ``src`` into a tier (those it holds already just count as used)."""
        new = [h for h in hashes if h not in tier.resident]
        if not new:
            return
        nbytes = len(new) * self.block_bytes
        if tier is self.host or self.host is None:
            self.d2h.reserve(self._now, nbytes, copies=len(new))  # from HBM (to SSD through host when there is no host tier)
        if tier is self.ssd:
            self.ssd_link.reserve(self._now, nbytes, self._ssd_write_bw)
        room = tier.capacity - len(tier.pin_counts)  # blocks held for a pending fetch stay
        if room > 0:
            tier.serve(new[:room], now=self._now)  # its evictions move down first (their copies too)
            if self.copies is not None:
                self.copies.copy(src, self._name(tier), [h for h in new[:room] if h in tier.resident])
        if len(new) > room:  # no room even after evicting: on to the next tier, or gone
            if tier is self.host and self.ssd is not None:
                self._store(self.ssd, new[room:], src)
            else:
                self.counters.dropped += len(new) - room

    # ---- flows up -----------------------------------------------------------------
    def plan(self, hashes: Sequence[int], now: float, arrival: float | None = None) -> FetchPlan:
        """Before HBM allocates a request: which of its blocks missing from HBM to restore.

        Those blocks are pinned in their tier until ``complete`` (or ``cancel``), so the
        demotions the allocation causes cannot push them out first. SSD blocks are pre-staged
        while the request waits (from ``arrival``): only the part of their read that the wait
        did not hide counts against fetching them.
        """
        self._now = max(self._now, now)
        resident = self.hbm.resident
        plan = FetchPlan(arrival=now if arrival is None else min(arrival, now))
        waited = now - plan.arrival
        plan.links = [(link, link.busy_until, link.bytes_moved) for link in (self.h2d, self.ssd_link)]
        for tier, idx in self._runs(hashes, [i for i, h in enumerate(hashes) if h not in resident]):
            if self._worth_fetching(tier, idx, waited):
                plan.restored_idx.extend(idx)
                plan.pins.append((tier, tier.acquire([hashes[i] for i in idx], now=now)))
                # reads are queued now, ahead of the write-back the allocation will cause
                start = max(self._now, self.h2d.busy_until)
                plan.started_at = min(plan.started_at, start) if plan.ready_at else start
                plan.ready_at = max(plan.ready_at, self._transfer_up(tier, len(idx), plan.arrival))
            else:
                plan.recomputed += len(idx)
        plan.restored_idx.sort()
        return plan

    def cancel(self, plan: FetchPlan) -> None:
        """The allocation failed (HBM busy, nothing evicted): unpin and unqueue; it will plan again."""
        for tier, alloc in plan.pins:
            tier.release(alloc, self._now)
        for link, busy_until, moved in plan.links:
            link.busy_until, link.bytes_moved = busy_until, moved
        plan.pins.clear()

    def complete(self, plan: FetchPlan, hashes: Sequence[int], hit_idx: Sequence[int],
                 new_idx: Sequence[int], now: float, record: bool = True) -> None:
        """After HBM allocated the request: transfers, counters (unless ``record`` is False: a
        preempted request's re-admission), copies down."""
        c = self.counters if record else TierCounters()
        c.accessed_blocks += len(hashes)
        c.hbm_hits += len(hit_idx)
        c.recomputed += plan.recomputed
        for tier, alloc in plan.pins:
            blocks = list(alloc.hashes)
            if self.copies is not None:  # into the HBM blocks the allocation gave them
                self.copies.copy(self._name(tier), "hbm", blocks)
            if tier is self.host:
                c.host_hits += len(blocks)
            else:
                c.ssd_hits += len(blocks)
            tier.release(alloc, now)
            if self.settings.mode == "exclusive":
                tier.remove(blocks)  # it lives in HBM now
        plan.pins.clear()
        restored = set(plan.restored_idx)
        self.produced([hashes[i] for i in new_idx if i not in restored], now)

    def _transfer_up(self, tier: BlockPool, blocks: int, arrival: float) -> float:
        nbytes = blocks * self.block_bytes
        if tier is self.host:
            return self.h2d.reserve(self._now, nbytes, copies=blocks)
        # SSD -> host staged from the request's arrival (while it waited), then host -> HBM
        return max(self.ssd_link.reserve(arrival, nbytes), self.h2d.reserve(self._now, nbytes, copies=blocks))

    def _runs(self, hashes: Sequence[int], new_idx: Sequence[int]) -> list[tuple[BlockPool, list[int]]]:
        """Runs of consecutive missing depths held by one lower tier (host looked up first)."""
        runs: list[tuple[BlockPool, list[int]]] = []
        for i in new_idx:
            h = hashes[i]
            tier = self.host if self.host is not None and h in self.host.resident else (
                self.ssd if self.ssd is not None and h in self.ssd.resident else None)
            if tier is None:
                continue
            if runs and runs[-1][0] is tier and runs[-1][1][-1] == i - 1:
                runs[-1][1].append(i)
            else:
                runs.append((tier, [i]))
        return runs

    def transfer_seconds(self, tier: BlockPool, blocks: int, waited: float = 0.0) -> float:
        """Time a restore of ``blocks`` adds once the request is admitted (links idle)."""
        nbytes = blocks * self.block_bytes
        host = nbytes / self.h2d.bandwidth + blocks * self.h2d.per_copy_s
        if tier is self.host:
            return host
        return max(nbytes / self.ssd_link.bandwidth - waited, host)  # the wait hid part of the SSD read

    def _worth_fetching(self, tier: BlockPool, idx: list[int], waited: float) -> bool:
        fetch = self.settings.fetch
        if fetch != "auto":
            return fetch == "always"
        return self.transfer_seconds(tier, len(idx), waited) < sum(self.recompute_cost(i) for i in idx)

    def lower_overlap(self, replica_id: str, hashes: Sequence[int], hbm_prefix: int) -> dict[str, int]:
        """For a router: the run of blocks after the HBM prefix that host / SSD hold, per tier
        (what an index fed this replica's tier events answers; zero counts omitted)."""
        host = self.host.resident if self.host is not None else {}
        ssd = self.ssd.resident if self.ssd is not None else {}
        return lower_overlap(replica_id, hashes, hbm_prefix, host, ssd)

    # ---- reporting ------------------------------------------------------------------
    def stats(self) -> dict:
        c = self.counters
        n = c.accessed_blocks or 1
        out = {
            "mode": self.settings.mode, "fetch": self.settings.fetch, "accessed_blocks": c.accessed_blocks,
            "hbm_block_hit_ratio": c.hbm_hits / n, "host_block_hit_ratio": c.host_hits / n,
            "ssd_block_hit_ratio": c.ssd_hits / n, "fetched_blocks": c.host_hits + c.ssd_hits,
            "recomputed_from_tier_blocks": c.recomputed, "demoted_blocks": c.demoted, "dropped_blocks": c.dropped,
            "bytes_moved": {link.name: link.bytes_moved for link in (self.h2d, self.d2h, self.ssd_link)},
        }
        for name, tier in self._named():
            out[f"{name}_blocks"] = tier.capacity
            out[f"{name}_used_blocks"] = tier.used
            out[f"{name}_policy"] = tier.policy.name
        return out
