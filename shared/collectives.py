"""The all-reduce of a ``--tp`` group, priced as NCCL prices and picks it.

NCCL times each (algorithm, protocol) for a message of ``n`` bytes on ``r`` ranks as
``latency + n / algorithm bandwidth`` and runs the fastest (``ncclTopoTuneModel`` and
``ncclTopoGetAlgoTime`` in NVIDIA/nccl's src/graph/tuning.cc). Within one node:

* latency: ``base[a][p] + 2 (r - 1) x hop[link][a][p]`` for ring and tree alike (NCCL's tables; the
  2 (r - 1) steps of a ring all-reduce, the chain up and down of a one-node tree);
* bandwidth: the link's bus bandwidth ``B`` (what nccl-tests reports as ``busbw`` for large
  messages, the Simple protocol), less each protocol's overhead: LL carries 4 data bytes in 8
  (``B / 2``, capped at NCCL's ``llMaxBw`` for the GPU's generation), LL128 120 in 128
  (``0.92 B``; NCCL enables it over NVLink only), a tree ``0.92 B`` (LL ``/ 3.8``, LL128 ``x 7/9``)
  and a per-size correction; then turned into the algorithm's bandwidth: a ring ``B r / (2 (r - 1))``,
  a tree ``B / 2``.

So a ring's Simple protocol on a large message takes ``2 (r - 1) / r x n / B``, the form nccl-tests
reports; small messages pay the per-call latency (LL). NCCL's trees pay off across nodes: within one, at
every size and rank count tried (docs/calibration.md), timing both picks the ring.

What differs from NCCL: ``B`` is a published measurement of the link (``link_of``; docs/sources.md),
not NCCL's own topology estimate (channels x per-channel bandwidth), and over PCIe each hop costs the
measured small-message latency beyond NCCL's table (``hop_extra_s``). Left out: NVLink SHARP (NVLS,
large messages on NVSwitch systems), the per-channel caps, and vLLM's own all-reduce kernel for small
messages (docs/calibration.md, "Tensor parallelism").
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.devspecs import PCIE_LANE_BYTES_PER_S, GpuSpec

US = 1e-6
ALGORITHMS = ("ring", "tree")
PROTOCOLS = ("LL", "LL128", "Simple")

# NCCL's latencies, microseconds (src/graph/tuning.cc, ncclTunerConstantsDefaults, NVIDIA/nccl master 5067397c):
# the base per call, and per hop over NVLink and over PCIe.
BASE_US = {("tree", "LL"): 6.8, ("tree", "LL128"): 14.0, ("tree", "Simple"): 8.4,
           ("ring", "LL"): 6.6, ("ring", "LL128"): 14.0, ("ring", "Simple"): 8.4}
HOP_US = {
    True: {("tree", "LL"): 0.6, ("tree", "LL128"): 1.25, ("tree", "Simple"): 4.0,
           ("ring", "LL"): 0.6, ("ring", "LL128"): 1.9, ("ring", "Simple"): 3.4},  # NVLink
    False: {("tree", "LL"): 1.0, ("tree", "LL128"): 1.9, ("tree", "Simple"): 4.0,
            ("ring", "LL"): 1.0, ("ring", "LL128"): 2.5, ("ring", "Simple"): 5.7},  # PCIe
}
# NCCL's tree correction: bandwidth factors by log2(bytes / 64), 64 B to 256 MiB (larger: 1.0)
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9),
}
NO_CAP = float("inf")

# Bus bandwidth of NVLink by generation: nccl-tests all_reduce_perf, large messages, ring (docs/sources.md).
# NVLink 3 (A100 SXM, 300 GB/s a direction): 232.5 GB/s on 8 A100s (NVIDIA/nccl-tests#175). NVLink 4 (H100 and
# H200 SXM, 450 GB/s): 370 GB/s with NCCL_ALGO=RING, "450GB/s is the line rate; with the protocol overhead (~20%)"
# (NCCL's maintainer, NVIDIA/nccl-tests#212; 366 GB/s measured on 4 H100s, waynehacking8/nccl-collectives-bench).
NVLINK_BUS = {"nvlink3": 232.5e9, "nvlink4": 370e9}
# NCCL's LL cap on one node by GPU generation (llMaxBws: Ampere 87.7 GB/s, Hopper 141)
NVLINK_LL_MAX = {"nvlink3": 87.7e9, "nvlink4": 141e9}
# Any other NVLink-class link ("nvlink", "hccs"): its line rate (GpuSpec.link_bandwidth) less NVLink 4's protocol
# overhead, 370 / 450
NVLINK_EFFICIENCY = 370.0 / 450.0
# PCIe with peer-to-peer, bus bandwidth over the x16 wire rate: PCIe 4.0 24.5 GB/s of 31.5 (6 RTX 4090s with
# peer-to-peer, all_reduce_perf at 32 MiB, tinygrad/open-gpu-kernel-modules README), PCIe 5.0 40.1 GB/s of 63.0
# (8 RTX PRO 6000s, NCCL defaults, 32 MiB, voipmonitor/rtx6kpro hardware/pcie-bandwidth.md); PCIe 3.0 takes 4.0's.
_X16 = {gen: 16 * lane for gen, lane in PCIE_LANE_BYTES_PER_S.items()}
PCIE_P2P_FRACTION = {3: 24.5e9 / _X16[4], 4: 24.5e9 / _X16[4], 5: 40.1e9 / _X16[5]}
# PCIe through host memory (no peer-to-peer: NCCL's SHM transport): 13.0 GB/s a direction on PCIe 4.0 x16, half
# the 25.6-26.2 GB/s two RTX 4090s copy both ways at once without peer-to-peer (p2pBandwidthLatencyTest,
# tinygrad/open-gpu-kernel-modules#6); other generations by their wire rate
PCIE_HOST_FRACTION = 13.0e9 / _X16[4]
# Per hop beyond NCCL's PCIe table, from the smallest all-reduce on 8 GPUs (LL ring: 6.6 + 14 hops x 1.0 us):
# 24.3 us with peer-to-peer (8 RTX PRO 6000s, 256 B-64 KiB, rtx6kpro), 42.1 us through host memory (8 RTX 4090s,
# 8 B, NVIDIA/nccl#1530)
PCIE_P2P_HOP_EXTRA_S = (24.3 - 20.6) / 14 * US
PCIE_HOST_HOP_EXTRA_S = (42.1 - 20.6) / 14 * US


@dataclass(frozen=True, slots=True)
class LinkModel:
    """What a --tp group's all-reduce sees of the link between its GPUs."""

    kind: str  # GpuSpec.link_kind: nvlink3, nvlink4, nvlink, hccs or pcie
    bus_bytes_per_s: float  # B: large-message ring bus bandwidth (Simple)
    nvlink: bool  # NCCL's NVLink latencies and LL128; else its PCIe ones
    hop_extra_s: float = 0.0  # measured latency per hop beyond NCCL's table
    ll_max_bytes_per_s: float = NO_CAP  # NCCL's LL bandwidth cap
    peer_to_peer: bool = True  # False: staged through host memory

    @property
    def protocols(self) -> tuple[str, ...]:
        """LL128 only over NVLink, as NCCL enables it by default."""
        return PROTOCOLS if self.nvlink else ("LL", "Simple")


@dataclass(frozen=True, slots=True)
class AllReduce:
    """NCCL's choice for one all-reduce and its seconds."""

    algorithm: str
    protocol: str
    seconds: float
    latency_s: float
    alg_bytes_per_s: float  # the chosen (algorithm, protocol)'s algorithm bandwidth


def link_of(gpu: GpuSpec) -> LinkModel:
    """The link a --tp group of ``gpu`` all-reduces over, from the preset's ``link_kind`` and PCIe fields."""
    kind = gpu.link_kind
    if kind in NVLINK_BUS:
        return LinkModel(kind, NVLINK_BUS[kind], True, ll_max_bytes_per_s=NVLINK_LL_MAX[kind])
    if kind != "pcie":
        return LinkModel(kind, gpu.link_bandwidth * NVLINK_EFFICIENCY, True)
    wire = gpu.pcie_bytes_per_s
    if wire <= 0.0:  # generation not recorded (a device profile): its link_bandwidth is the bus bandwidth
        return LinkModel(kind, gpu.link_bandwidth, False, PCIE_P2P_HOP_EXTRA_S if gpu.peer_to_peer
                         else PCIE_HOST_HOP_EXTRA_S, peer_to_peer=gpu.peer_to_peer)
    if gpu.peer_to_peer:
        return LinkModel(kind, PCIE_P2P_FRACTION[gpu.pcie_gen] * wire, False, PCIE_P2P_HOP_EXTRA_S)
    return LinkModel(kind, PCIE_HOST_FRACTION * wire, False, PCIE_HOST_HOP_EXTRA_S, peer_to_peer=False)


def _bus(link: LinkModel, algorithm: str, protocol: str) -> float:
    """NCCL's bus bandwidth for (algorithm, protocol) from the link's Simple-protocol one."""
    bus = link.bus_bytes_per_s
    if algorithm == "ring":
        if protocol == "LL":
            return min(link.ll_max_bytes_per_s, bus * 0.5)
        return bus * 0.92 if protocol == "LL128" else bus
    bus *= 0.92
    if protocol == "LL":
        return min(bus / 3.8, link.ll_max_bytes_per_s)
    return bus * 7.0 / 9.0 if protocol == "LL128" else bus


def _log2_floor(n: int) -> int:
    return n.bit_length() - 1 if n > 0 else -1


def candidate(link: LinkModel, ranks: int, nbytes: float, algorithm: str, protocol: str) -> AllReduce:
    """One (algorithm, protocol)'s time for an all-reduce of ``nbytes`` over ``ranks`` GPUs of one node."""
    latency = (BASE_US[algorithm, protocol] + 2 * (ranks - 1) * HOP_US[link.nvlink][algorithm, protocol]) * US \
        + 2 * (ranks - 1) * link.hop_extra_s
    bw = _bus(link, algorithm, protocol)
    if algorithm == "ring":
        bw *= ranks / (2.0 * (ranks - 1))
    else:
        bw *= 0.5
        log_size = _log2_floor(int(nbytes) >> 6)
        factors = TREE_CORRECTION[protocol]
        if 0 <= log_size < len(factors):
            bw *= factors[log_size]
    return AllReduce(algorithm, protocol, latency + nbytes / bw, latency, bw)


def all_reduce(link: LinkModel, ranks: int, nbytes: float) -> AllReduce:
    """The fastest (algorithm, protocol) NCCL's model finds; a zero-second one for one rank or no bytes."""
    if ranks <= 1 or nbytes <= 0:
        return AllReduce("none", "none", 0.0, 0.0, NO_CAP)
    best: AllReduce | None = None
    for algorithm in ALGORITHMS:
        for protocol in link.protocols:
            c = candidate(link, ranks, nbytes, algorithm, protocol)
            if best is None or c.seconds < best.seconds:
                best = c
    assert best is not None
    return best


def all_reduce_seconds(link: LinkModel, ranks: int, nbytes: float) -> float:
    return all_reduce(link, ranks, nbytes).seconds



# ---- expert parallelism's dispatch and combine ---------------------------------------------------------------
# vLLM's default all2all backend (``--all2all-backend allgather_reducescatter``, AgRsAll2AllManager in
# vllm/distributed/device_communicators/all2all.py) dispatches by an all-gather of every DP rank's hidden states
# (each rank then runs its local experts over every rank's tokens) and combines by a reduce-scatter of the
# outputs. NCCL prices both as a ring of r - 1 steps (nsteps in src/graph/tuning.cc): ``base + (r - 1) x hop``
# latency, and the whole gathered message of r x n bytes at the ring's algorithm bandwidth ``bus x r / (r - 1)``,
# that is ``(r - 1) x n / bus``; the fastest protocol runs, as for the all-reduce.
def all_gather_seconds(link: LinkModel, ranks: int, rank_bytes: float) -> float:
    """An all-gather (or reduce-scatter) in which each of ``ranks`` GPUs contributes ``rank_bytes``; 0.0 for one
    rank or no bytes."""
    if ranks <= 1 or rank_bytes <= 0:
        return 0.0
    best = float("inf")
    for protocol in link.protocols:
        latency = (BASE_US["ring", protocol] + (ranks - 1) * HOP_US[link.nvlink]["ring", protocol]) * US \
            + (ranks - 1) * link.hop_extra_s
        best = min(best, latency + rank_bytes * ranks / (_bus(link, "ring", protocol) * ranks / (ranks - 1)))
    return best
