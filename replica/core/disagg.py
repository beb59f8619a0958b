"""Disaggregated prefill and decode: roles, the topology, the decider and the transfer network
(pure, no I/O; the simulator and the live router and replicas use the same definitions).

A replica has a **role** (``ROLES``): ``both`` prefills and decodes its own requests (colocated, the
default), ``prefill`` computes prompts and hands their KV to a decode instance, ``decode`` receives
it and generates. ``Topology`` is the one definition of which replicas a cluster has and their
ids; ``kvemu sim``, ``sweep``, ``up``, the router and the Python API all build it.

A request's path under P/D (vLLM's disaggregated serving, as llm-d and Dynamo drive it): the router
picks the decode instance first (the routing strategy over the decode pool), then asks the decider
(``PdSettings.remote``) whether the prompt goes through a remote prefill; if so it picks a prefill
instance (the strategy over the prefill pool), which computes the prompt, keeps its KV cached as any
prefix cache does and holds the request's blocks until the transfer ends. The decode instance
reserves its blocks when the transfer starts (vLLM's ``WAITING_FOR_REMOTE_KVS``), receives the KV it
lacks over the link, recomputes the prompt's last token (vLLM's decode instance does: that forward
yields the first token) and decodes.

The decider (``PD_DECIDERS``): ``always``, ``never``, or ``prefix``, llm-d's prefix rule: remote
prefill only when the prompt tokens the decode instance does not already hold exceed a threshold,
by default 16 blocks' worth (256 tokens at 16-token blocks: a prompt that short costs a decode step's
worth of compute to prefill in place, less than a transfer round trip and a second queue).

The transfer network: every instance has a NIC (``nic_gbps``: one NIC per GPU, ``--tp`` GPUs per
instance), each direction a ``Link`` shared by the transfers in flight on it (replica/core/tiers/link.py,
the one link model). A transfer crosses the prefill instance's send side and the decode instance's
receive side; it is delivered when both are done (the later of the two finishes), plus the link's
base latency. Defaults: the NIC generation of the GPU preset (H100 / H200: ConnectX-7, 400 Gb/s NDR,
one per GPU as in NVIDIA's DGX and HGX systems; A100: ConnectX-6, 200 Gb/s HDR; Ascend 910B2: the
200 Gb/s RoCE port of each NPU in an Atlas 800T A2), and a 50 us base latency (BLIS's "NIXL RDMA"
default). What crosses: by default only the prompt KV the decode instance lacks (what vLLM's NIXL
connector reads: the decoder allocates only blocks it has no prefix hit for); ``full`` moves the
whole prompt, as llm-d's inference simulator and BLIS charge. The send is not layer-pipelined:
vLLM's NIXL connector lets the decode instance read the blocks once the prefill request has finished
(``request_finished`` holds them), so the transfer starts after the prefill's last step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from replica.core.tiers.link import Link, Transfer
from replica.core.tiers.stack import TierSettings
from shared.errors import InputError
from shared.validate import check_int, check_number

ROLES = ("both", "prefill", "decode")
PD_DECIDERS = ("always", "never", "prefix")
PD_TRANSFERS = ("missing", "full")
DEFAULT_PD_DECIDER = "prefix"
DEFAULT_PD_THRESHOLD_BLOCKS = 16  # llm-d's prefix decider threshold, in blocks of the model's block size
DEFAULT_PD_LATENCY_S = 50e-6  # BLIS's P/D transfer base latency ("NIXL RDMA")
# a live prefill instance: the fraction of its pool one client without the cluster token may hold for remote
# decodes (replica/pd_share.py); kvemu's router sends the token, a third-party proxy is one such client
DEFAULT_PD_HOLD_SHARE = 0.25
# Gb/s of one GPU's NIC, by GPU preset (the module docstring says where each comes from)
NIC_GBPS = {"h200": 400.0, "h100": 400.0, "a100-80gb": 200.0, "a100-80gb-pcie": 200.0, "ascend-910b2": 200.0}
DEFAULT_NIC_GBPS = 400.0  # a device profile from `kvemu calibrate` names no NIC: ConnectX-7


def check_role(role: str, field_name: str = "role") -> None:
    if role not in ROLES:
        raise InputError(field_name, f"must be one of {', '.join(ROLES)}, got {role!r}")


def nic_gbps(gpu: str, tp: int = 1) -> float:
    """Gb/s of an instance's NIC: its GPUs' NICs together (one per GPU)."""
    return NIC_GBPS.get(gpu, DEFAULT_NIC_GBPS) * tp


@dataclass(frozen=True, slots=True)
class Topology:
    """Which replicas a cluster has: ``colocated`` replicas of role ``both`` and the P/D pools.

    Ids: ``replica-i`` for colocated replicas (the ids ``kvemu up`` has always given), ``prefill-i``
    and ``decode-i`` for the pools. A P/D cluster needs both pools; colocated replicas may sit beside
    them (they prefill their own requests and are candidates of the decode pool)."""

    colocated: int = 1
    prefill: int = 0
    decode: int = 0

    def __post_init__(self) -> None:
        for name in ("colocated", "prefill", "decode"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                flag = "--replicas" if name == "colocated" else f"--{name}-replicas"
                raise InputError(flag, f"must be an integer >= 0, got {value!r}")
        if (self.prefill > 0) != (self.decode > 0):
            missing, given = ("decode", "prefill") if self.prefill else ("prefill", "decode")
            raise InputError(f"--{missing}-replicas", f"a P/D cluster needs both pools: {given} replicas"
                                                    f" ({getattr(self, given)}) but no {missing} replica; give --{missing}-replicas N"
                                                    f" (N >= 1), or neither for a colocated cluster")
        if self.colocated + self.decode == 0:
            raise InputError("--replicas", "the cluster has no replica: give --replicas N or"
                                         " --prefill-replicas P --decode-replicas D")

    @property
    def disaggregated(self) -> bool:
        return self.prefill > 0

    @property
    def total(self) -> int:
        return self.colocated + self.prefill + self.decode

    def members(self) -> list[tuple[str, str]]:
        """``(replica id, role)`` of every replica: colocated first, then prefill, then decode."""
        return ([(f"replica-{i}", "both") for i in range(self.colocated)]
                + [(f"prefill-{i}", "prefill") for i in range(self.prefill)]
                + [(f"decode-{i}", "decode") for i in range(self.decode)])


@dataclass(frozen=True, slots=True)
class PdSettings:
    """How a P/D cluster moves a request: the decider, its threshold and the transfer link."""

    decider: str = DEFAULT_PD_DECIDER
    threshold_tokens: int | None = None  # None: DEFAULT_PD_THRESHOLD_BLOCKS of the trace's blocks
    link_gbps: float | None = None  # Gb/s per instance NIC; None: the GPU preset's NIC x tp (nic_gbps)
    link_latency_s: float = DEFAULT_PD_LATENCY_S
    transfer: str = "missing"  # what crosses: the blocks the decoder lacks, or the full prompt

    def __post_init__(self) -> None:
        if self.decider not in PD_DECIDERS:
            raise InputError("pd_decider", f"must be one of {', '.join(PD_DECIDERS)}, got {self.decider!r}")
        if self.transfer not in PD_TRANSFERS:
            raise InputError("pd_transfer", f"must be one of {', '.join(PD_TRANSFERS)}, got {self.transfer!r}")
        if self.threshold_tokens is not None:
            check_int("pd_threshold_tokens", self.threshold_tokens, minimum=0)
        if self.link_gbps is not None:  # zero bandwidth would never deliver: refused here
            check_number("pd_link_gbps", self.link_gbps, above=0)
        check_number("pd_link_latency_s", self.link_latency_s, minimum=0)

    def threshold(self, block_size: int) -> int:
        return self.threshold_tokens if self.threshold_tokens is not None else DEFAULT_PD_THRESHOLD_BLOCKS * block_size

    def remote(self, input_tokens: int, decoder_cached_tokens: int, block_size: int) -> bool:
        """Whether a prompt goes through a remote prefill (the decider)."""
        if self.decider == "always":
            return True
        if self.decider == "never":
            return False
        return input_tokens - decoder_cached_tokens > self.threshold(block_size)

    def nic_bytes_per_s(self, gpu: str, tp: int) -> float:
        return (self.link_gbps * tp if self.link_gbps is not None else nic_gbps(gpu, tp)) * 1e9 / 8

    def transfer_tokens(self, input_tokens: int, decoder_hit_blocks: int, block_size: int) -> int:
        """Prompt tokens whose KV crosses the link: those the decode instance lacks, or all of them."""
        if self.transfer == "full":
            return input_tokens
        return max(input_tokens - decoder_hit_blocks * block_size, 0)


@dataclass(slots=True)
class PdTransfer:
    """One KV transfer in flight: its share of the sender's and the receiver's NIC."""

    src: str
    dst: str
    nbytes: int
    start: float
    send: Transfer
    recv: Transfer
    end: float = -1.0  # once delivered


@dataclass(slots=True)
class Nic:
    """One instance's NIC: a ``Link`` per direction (the simulator's network holds every instance's, a live
    replica its own)."""

    send: Link
    recv: Link

    @classmethod
    def of(cls, replica_id: str, bytes_per_s: float, latency_s: float) -> Nic:
        return cls(Link(f"{replica_id}:send", bytes_per_s, latency_s=latency_s),
                   Link(f"{replica_id}:recv", bytes_per_s, latency_s=latency_s))


def delivered_at(send_end: float, recv_end: float) -> float:
    """A KV transfer is delivered when both of its sides are done: the later of the sender's and the
    receiver's finish (each priced on its own NIC direction)."""
    return max(send_end, recv_end)


@dataclass(slots=True)
class PdNetwork:
    """The transfer network of a P/D cluster: every instance's NIC, each direction shared by the
    transfers in flight on it (processor sharing). One object serves the whole simulated cluster; a
    live instance holds the part it owns (its own NIC) and the two ends agree on the later finish."""

    latency_s: float = DEFAULT_PD_LATENCY_S
    nics: dict[str, Nic] = field(default_factory=dict)
    transfers: int = 0
    since: float = 0.0  # when the network started (utilisation's denominator)

    def add(self, replica_id: str, bytes_per_s: float) -> None:
        self.nics[replica_id] = Nic.of(replica_id, bytes_per_s, self.latency_s)

    def start(self, now: float, src: str, dst: str, nbytes: int) -> PdTransfer:
        if src not in self.nics or dst not in self.nics:
            raise InputError("remote_engine_id", f"no NIC for {src if src not in self.nics else dst!r}")
        self.transfers += 1
        return PdTransfer(src, dst, nbytes, now, self.nics[src].send.start(now, nbytes),
                          self.nics[dst].recv.start(now, nbytes))

    def finish(self, tr: PdTransfer) -> float:
        """When ``tr`` is delivered, projected from the transfers known now (a later start can only
        delay it: ask again when the projected time comes)."""
        if tr.end >= 0:
            return tr.end
        return delivered_at(self.nics[tr.src].send.finish(tr.send), self.nics[tr.dst].recv.finish(tr.recv))

    def settle(self, tr: PdTransfer, now: float) -> bool:
        """True when ``tr`` is delivered by ``now`` (both links settled to it): then ``tr.end`` is known."""
        end = self.finish(tr)
        if end > now + 1e-12 * max(1.0, now):  # the same projection may round a hair above it
            return False
        tr.end = end
        return True

    def stats(self, now: float) -> dict[str, dict[str, float]]:
        """Per NIC direction with traffic: bytes moved and the fraction of the run it was busy."""
        out: dict[str, dict[str, float]] = {}
        for nic in self.nics.values():
            for link in (nic.send, nic.recv):
                if link.bytes_moved:
                    out[link.name] = {"bytes": link.bytes_moved,
                                      "gbps": link.bandwidth * 8 / 1e9,
                                      "utilization": link.utilization(now, self.since)}
        return out


@dataclass(frozen=True, slots=True)
class PoolShape:
    """What one pool's instances are, where they differ from the cluster's flags (None: the cluster's):
    the GPU preset (with ``@tpN``), the KV capacity in blocks, and the memory tiers below HBM."""

    gpu: str | None = None
    capacity_blocks: int | None = None
    tiers: TierSettings | None = None

    def __post_init__(self) -> None:
        if self.capacity_blocks is not None:
            check_int("capacity_blocks", self.capacity_blocks, minimum=1)


@dataclass(frozen=True, slots=True)
class PdCluster:
    """The P/D part of a cluster: the pools' sizes and shapes and how requests cross between them."""

    prefill: int
    decode: int
    settings: PdSettings = PdSettings()
    prefill_pool: PoolShape = PoolShape()
    decode_pool: PoolShape = PoolShape()
    prefill_routing: str | None = None  # the prefill pool's strategy; None: the cluster's (--routing)

    def topology(self, colocated: int) -> Topology:
        return Topology(colocated, self.prefill, self.decode)

    def shape(self, role: str) -> PoolShape:
        return self.prefill_pool if role == "prefill" else self.decode_pool if role == "decode" else PoolShape()
