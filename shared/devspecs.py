"""The device side of the cost model: a GPU's peak rates and the efficiencies a model reaches
on it (shared by ``shared.costmodel`` and the device profiles of ``shared.devprofile``)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.errors import InputError
from shared.moe_cost import table_rows


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Fractions of the device's peak rates that each part of the work reaches."""

    linear: float = 0.64  # projection and MLP matrix products, of peak FLOP/s
    attention: float = 0.34  # attention (QK^T and AV), of peak FLOP/s
    kv_read: float = 0.22  # reading the cached prefix's K/V, of HBM bandwidth
    memory: float = 0.80  # weights and decode KV reads, of HBM bandwidth
    overhead_s: float = 0.0  # per layer per step run eagerly (kernel launches)
    decode_overhead_s: float = 0.0  # per layer per decode-only step, or any step replayed from a CUDA graph
    source: str = ""  # what these were fitted on
    # Decode steps beyond the H200 roofline (0 / None on the presets, which is that form): the
    # cost per sequence (per layer) outside the roofline, the fraction of memory bandwidth the
    # KV reads reach (None: ``memory``'s) and of peak FLOP/s the products reach (None:
    # ``linear``'s). A CPU step pays its products per sequence, on top of its reads, and reads
    # KV far slower than weights: there ``decode_seq_s`` > 0 and ``decode_linear`` is the cap.
    decode_seq_s: float = 0.0
    decode_kv: float | None = None
    decode_linear: float | None = None
    # Steps of at most this many tokens replay a captured CUDA graph and pay ``decode_overhead_s``
    # per layer, longer ones run eagerly and pay ``overhead_s``: vLLM captures steps up to 512
    # tokens (its default largest capture size; mixed steps piecewise, attention outside the
    # graph). A calibrated profile: the largest decode batch it timed through a graph (0 on a CPU).
    graph_tokens: int = 512
    # The fused-MoE layer (shared/moe_cost.py), a layer and step: a fixed cost, then the touched experts'
    # weights at ``moe_memory`` x HBM bandwidth or their tokens' products at ``moe_linear`` x peak, whichever
    # is slower (None: ``memory``'s, ``linear``'s); or, where an operator profile measured the layer,
    # ``moe_table``: rows of (tokens, experts touched, microseconds), which replaces the three
    moe_floor_s: float = 0.0
    moe_memory: float | None = None
    moe_linear: float | None = None
    moe_table: tuple[tuple[float, float, float], ...] = ()

    @property
    def moe_memory_eff(self) -> float:
        return self.memory if self.moe_memory is None else self.moe_memory

    @property
    def moe_linear_eff(self) -> float:
        return self.linear if self.moe_linear is None else self.moe_linear

    @property
    def decode_kv_eff(self) -> float:
        return self.memory if self.decode_kv is None else self.decode_kv

    @property
    def decode_linear_eff(self) -> float:
        return self.linear if self.decode_linear is None else self.decode_linear

    def __post_init__(self) -> None:
        for name in ("linear", "attention", "kv_read", "memory"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                raise InputError(name, f"efficiency must be a finite number > 0, got {value}")
        for name in ("decode_kv", "decode_linear", "moe_memory", "moe_linear"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int | float) and 0 < value < float("inf")):
                raise InputError(name, f"efficiency must be a finite number > 0 or null, got {value!r}")
        if not isinstance(self.graph_tokens, int) or isinstance(self.graph_tokens, bool) or self.graph_tokens < 0:
            raise InputError("graph_tokens", f"must be an integer >= 0, got {self.graph_tokens!r}")
        for name in ("overhead_s", "decode_overhead_s", "decode_seq_s", "moe_floor_s"):
            if not 0 <= getattr(self, name) < float("inf"):
                raise InputError(name, f"must be a finite number >= 0, got {getattr(self, name)}")
        object.__setattr__(self, "moe_table", table_rows(self.moe_table))  # a profile's JSON gives lists


# Bytes/s of one PCIe lane, one direction, after line coding: 3.0 8 GT/s and 4.0 16 GT/s and 5.0 32 GT/s,
# all 128b/130b (PCI-SIG's base specifications). A x16 link: 15.75, 31.5 and 63.0 GB/s.
PCIE_LANE_BYTES_PER_S = {3: 8e9 / 8 * 128 / 130, 4: 16e9 / 8 * 128 / 130, 5: 32e9 / 8 * 128 / 130}
# What GpuSpec.tp_link may name ("" : derived, see ``link_kind``)
TP_LINKS = ("", "nvlink3", "nvlink4", "nvlink", "hccs", "pcie")


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    peak_flops: float  # dense bf16/fp16 FLOP/s
    hbm_bandwidth: float  # bytes/s
    memory_bytes: float
    # GPU-GPU line rate, bytes/s a direction: the bus bandwidth of a --tp all-reduce over an NVLink-class link
    # ``link_kind`` names no measurement for ("nvlink", "hccs"), and over PCIe where ``pcie_gen`` is 0
    link_bandwidth: float = 450e9
    # Host <-> device copies from pinned memory: bytes/s per direction of one large copy, and
    # the cost of each copy call (what makes small KV blocks slow). Defaults: one H200 measured,
    # docs/calibration/h200-llama-3-8b.json (55.5 GB/s; 512 x 2 MiB copies 51.1 GB/s, 4096 x
    # 64 KiB copies 10.3 GB/s: this model gives 49.0 and 10.6).
    host_bandwidth: float = 55.5e9
    host_copy_overhead_s: float = 5e-6
    # True: the GPUs of a --tp replica talk over PCIe (no NVLink bridge), the same lanes as the host
    # copies, so the tier stack prices the all-reduce on the host link beside them (shared/collectives.py
    # says what the all-reduce gets alone)
    tp_over_host_link: bool = False
    # The card's host link (0: not recorded, as on a profile from `kvemu calibrate`): PCIe generation and
    # lanes, what a --tp all-reduce crosses on a card without NVLink. False: the GPUs cannot read each
    # other's memory over PCIe (GeForce cards: the driver turns peer-to-peer off), so NCCL stages each
    # transfer through host memory. shared/collectives.py prices the all-reduce from these.
    pcie_gen: int = 0
    pcie_lanes: int = 16
    peer_to_peer: bool = True
    # The link between the GPUs of a --tp group (shared/collectives.py): "nvlink3" (A100 SXM), "nvlink4" (H100 and
    # H200 SXM), "nvlink" or "hccs" (another NVLink-class link, at ``link_bandwidth``), "pcie" (no NVLink: the
    # PCIe fields above); "" (a profile that does not say): "pcie" where ``tp_over_host_link``, else "nvlink".
    tp_link: str = ""

    @property
    def link_kind(self) -> str:
        if self.tp_link:
            return self.tp_link
        return "pcie" if self.tp_over_host_link else "nvlink"

    @property
    def pcie_bytes_per_s(self) -> float:
        """One direction of the card's PCIe link on the wire (0.0 where the generation is not recorded)."""
        return PCIE_LANE_BYTES_PER_S.get(self.pcie_gen, 0.0) * self.pcie_lanes

    def __post_init__(self) -> None:
        if self.pcie_gen != 0 and self.pcie_gen not in PCIE_LANE_BYTES_PER_S:
            raise InputError("pcie_gen", f"must be 0 (not recorded) or one of {sorted(PCIE_LANE_BYTES_PER_S)},"
                                         f" got {self.pcie_gen!r}")
        if self.tp_link not in TP_LINKS:
            raise InputError("tp_link", f"must be one of {', '.join(repr(k) for k in TP_LINKS)}, got {self.tp_link!r}")
        if self.pcie_lanes not in (1, 2, 4, 8, 16):
            raise InputError("pcie_lanes", f"must be 1, 2, 4, 8 or 16, got {self.pcie_lanes!r}")
        if not isinstance(self.host_copy_overhead_s, int | float) or not 0 <= self.host_copy_overhead_s < float("inf"):
            raise InputError("host_copy_overhead_s", f"must be a finite number >= 0, got {self.host_copy_overhead_s!r}")
        for name in ("peak_flops", "hbm_bandwidth", "memory_bytes", "link_bandwidth", "host_bandwidth"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 < value < float("inf"):
                raise InputError(name, f"must be a finite number > 0, got {value!r}")
