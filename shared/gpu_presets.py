"""The GPU presets (``--gpu NAME``): each card's datasheet rates, memory as the device reports it, its
host link, and the link a ``--tp`` group of it all-reduces over (``tp_link``; shared/collectives.py
prices it). docs/sources.md names each figure's source; docs/calibration.md tabulates them. ``get_gpu``
names one (an alias, any case); ``split_tp`` reads the ``@tpN`` a gpu setting carries."""

from __future__ import annotations

from shared.devspecs import GpuSpec
from shared.errors import InputError, UnknownNameError

MIB = 1024**2

# Device memory as the device reports it (nvidia-smi / npu-smi, MiB), not the marketing GB.
GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        # A100 80GB SXM: 81,920 MiB. PCIe 4 host link: about half the H200's. NVLink 3: 12 links, 300 GB/s a direction.
        GpuSpec("a100-80gb", 312e12, 2.039e12, 81920 * MIB, 300e9, 25e9, pcie_gen=4, tp_link="nvlink3"),
        # A100 80GB PCIe (FlashGen's instance, Azure's NC A100 v4: two of them, no NVLink bridge):
        # 1,935 GB/s HBM2e; GPU to GPU and host to GPU both over PCIe 4.0 x16 with peer-to-peer, 31.5 GB/s a
        # direction on the wire, about 25 GB/s in large pinned copies (what the SXM preset's host link assumes).
        GpuSpec("a100-80gb-pcie", 312e12, 1.935e12, 81920 * MIB, 25e9, 25e9, tp_over_host_link=True, pcie_gen=4,
                tp_link="pcie"),
        # H100 SXM 80GB HBM3: 81,559 MiB; NVLink 4, 18 links, 450 GB/s a direction
        GpuSpec("h100", 989e12, 3.35e12, 81559 * MIB, pcie_gen=5, tp_link="nvlink4"),
        # H200 SXM 141GB HBM3e: 143,771 MiB; NVLink 4 as the H100
        GpuSpec("h200", 989e12, 4.8e12, 143771 * MIB, pcie_gen=5, tp_link="nvlink4"),
        # 910B2: 65,536 MB HBM; HCCS between the NPUs, 196 GB/s (not NCCL: priced as an NVLink-class link)
        GpuSpec("ascend-910b2", 376e12, 1.6e12, 65536 * MIB, 196e9, 25e9, tp_link="hccs"),
        # Cards without NVLink (docs/sources.md has each datasheet): a --tp all-reduce crosses PCIe (tp_link "pcie",
        # shared/collectives.py: the measured bus bandwidth of the card's PCIe generation, with or without
        # peer-to-peer). Their host copies go at the large pinned copy rate of the generation: 25 GB/s on 4.0 x16
        # (as a100-80gb-pcie), 55.5 GB/s on 5.0 x16 (the H200's measured host copies). Peak: dense BF16 tensor
        # FLOP/s with FP32 accumulate, as vLLM's GEMMs run (no sparsity figure).
        # GeForce RTX 4090 (Ada whitepaper): 165.2 TFLOPS (FP32 accumulate runs at half the FP16-accumulate
        # rate on GeForce), 1,008 GB/s GDDR6X, 24,564 MiB; PCIe 4.0 x16 and no peer-to-peer.
        GpuSpec("rtx-4090", 165.2e12, 1.008e12, 24564 * MIB, 25e9, 25e9, tp_over_host_link=True, pcie_gen=4,
                peer_to_peer=False, tp_link="pcie"),
        # RTX PRO 6000 Blackwell Server Edition: 1,597 GB/s GDDR7, 97,887 MiB; 4 x its 120 TFLOPS FP32 (GB202's
        # tensor rate at FP32 accumulate, full on the professional cards); PCIe 5.0 x16 with peer-to-peer (measured
        # between these cards, docs/sources.md). The Workstation Edition runs faster: 1,792 GB/s and 125 TFLOPS
        # FP32 (500 dense BF16).
        GpuSpec("rtx-pro-6000", 480e12, 1.597e12, 97887 * MIB, 55.5e9, 55.5e9, tp_over_host_link=True, pcie_gen=5,
                tp_link="pcie"),
        # L40S (datasheet): 362.05 TFLOPS dense BF16, 864 GB/s GDDR6, 46,068 MiB; PCIe 4.0 x16 with peer-to-peer.
        GpuSpec("l40s", 362.05e12, 0.864e12, 46068 * MIB, 25e9, 25e9, tp_over_host_link=True, pcie_gen=4,
                tp_link="pcie"),
        # H100 PCIe (datasheet): 756 TFLOPS dense BF16 (1,513 with sparsity), 2.0 TB/s HBM2e, 81,559 MiB;
        # PCIe 5.0 x16 with peer-to-peer. Assumed without the optional NVLink bridge (600 GB/s between a pair).
        GpuSpec("h100-pcie", 756e12, 2.0e12, 81559 * MIB, 55.5e9, 55.5e9, tp_over_host_link=True, pcie_gen=5,
                tp_link="pcie"),
    )
}

_ALIASES = {
    "a100": "a100-80gb",
    "a100-pcie": "a100-80gb-pcie",
    "910b2": "ascend-910b2",
    "4090": "rtx-4090",
}


def get_gpu(name: str) -> GpuSpec:
    """A preset by name or alias, any case."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in GPUS:
        raise UnknownNameError("gpu", name, list(GPUS))
    return GPUS[key]


def split_tp(spec: str) -> tuple[str, int]:
    """``"h200@tp2"`` -> ("h200", 2): how ``--tp`` travels inside the gpu setting."""
    base, sep, tp = spec.rpartition("@tp")
    if not sep:
        return spec, 1
    if not tp.isdigit() or int(tp) < 1:
        raise InputError("tp", f"must be an integer >= 1, got {tp!r}")
    return base, int(tp)
