"""The --tp all-reduce priced as NCCL picks and runs it (shared/collectives.py), by hand."""

import pytest

from kvemu.options.tiers import tiers_on
from shared.collectives import LinkModel, all_reduce, candidate, link_of
from shared.costmodel import CostModel, GpuSpec, StepWork, get_gpu
from shared.errors import InputError

US = 1e-6
# a PCIe link of 40 GB/s bus bandwidth and NCCL's own PCIe latencies (no measured extra)
PCIE = LinkModel("pcie", 40e9, nvlink=False)
NVLINK4 = link_of(get_gpu("h100"))


def test_a_large_ring_all_reduce_is_the_latency_then_2_n_minus_1_over_n_of_the_bytes_over_the_bus_bandwidth():
    size = 64 * 2**20
    two, four = all_reduce(PCIE, 2, size), all_reduce(PCIE, 4, size)
    assert (two.algorithm, two.protocol, four.algorithm, four.protocol) == ("ring", "Simple", "ring", "Simple")
    # Simple ring over PCIe: 8.4 us a call + 5.7 us a hop, 2 (n-1) hops; then 2 (n-1)/n x bytes / 40 GB/s
    assert two.seconds == pytest.approx((8.4 + 2 * 5.7) * US + 1.0 * size / 40e9)  # 1,697.5 us
    assert four.seconds == pytest.approx((8.4 + 6 * 5.7) * US + 1.5 * size / 40e9)  # 2,559.2 us


def test_a_small_all_reduce_takes_the_low_latency_protocol_and_a_large_one_the_simple_one():
    small = all_reduce(PCIE, 2, 8192)
    # LL: 6.6 us + 2 hops x 1.0 us, at half the bus bandwidth (4 data bytes in 8) = 20 GB/s on 2 ranks
    assert (small.algorithm, small.protocol) == ("ring", "LL")
    assert small.seconds == pytest.approx(8.6 * US + 8192 / 20e9)  # 9.01 us
    # the tree on one node: 6.8 + 2 x 1.0 us, 0.92 / 3.8 of the bus, halved, x 0.7 (NCCL's correction at 8 KiB)
    tree = candidate(PCIE, 2, 8192, "tree", "LL")
    assert tree.seconds == pytest.approx(8.8 * US + 8192 / (40e9 * 0.92 / 3.8 * 0.5 * 0.7))  # 11.2 us: not chosen
    # LL and Simple cross where 8.6 us + x / 20 GB/s = 19.8 us + x / 40 GB/s: x = 448,000 bytes
    assert all_reduce(PCIE, 2, 440_000).protocol == "LL"
    assert all_reduce(PCIE, 2, 456_000).protocol == "Simple"


def test_over_nvlink_eight_ranks_take_ll128_between_ll_and_simple():
    # NVLink 4: bus 370 GB/s, LL capped at 141 GB/s (Hopper); on 8 ranks a ring's bandwidth is x 8/14.
    # LL 15.0 us + x / 80.6 GB/s, LL128 40.6 us + x / 194.5 GB/s, Simple 56.0 us + x / 211.4 GB/s:
    # LL up to 3.5 MB, LL128 up to 37 MB, then Simple
    assert [all_reduce(NVLINK4, 8, s).protocol for s in (2**20, 16 * 2**20, 256 * 2**20)] == ["LL", "LL128", "Simple"]
    mid = all_reduce(NVLINK4, 8, 16 * 2**20)
    assert mid.seconds == pytest.approx((14.0 + 14 * 1.9) * US + 16 * 2**20 / (370e9 * 0.92 * 8 / 14))
    # on 2 ranks Simple has the lower latency (8.4 + 2 x 3.4 against 14 + 2 x 1.9 us) and the higher bandwidth
    # than LL128: LL (7.8 us + x / 141 GB/s) then Simple (15.2 us + x / 370 GB/s) from 1.69 MB
    assert [all_reduce(NVLINK4, 2, s).protocol for s in (2**20, 4 * 2**20, 2**26)] == ["LL", "Simple", "Simple"]
    # over PCIe NCCL leaves LL128 off
    assert "LL128" not in PCIE.protocols and all_reduce(PCIE, 8, 16 * 2**20).protocol != "LL128"


def test_the_link_each_preset_has():
    links = {name: link_of(get_gpu(name)) for name in ("h100", "h200", "a100-80gb", "a100-80gb-pcie", "l40s",
                                                       "rtx-pro-6000", "h100-pcie", "rtx-4090", "ascend-910b2")}
    assert {n: (link.kind, round(link.bus_bytes_per_s / 1e9, 2), link.peer_to_peer) for n, link in links.items()} == {
        "h100": ("nvlink4", 370.0, True), "h200": ("nvlink4", 370.0, True), "a100-80gb": ("nvlink3", 232.5, True),
        "a100-80gb-pcie": ("pcie", 24.5, True), "l40s": ("pcie", 24.5, True),  # PCIe 4.0 x16, peer-to-peer
        "rtx-pro-6000": ("pcie", 40.1, True), "h100-pcie": ("pcie", 40.1, True),  # PCIe 5.0 x16, peer-to-peer
        "rtx-4090": ("pcie", 13.0, False),  # PCIe 4.0 x16 through host memory
        "ascend-910b2": ("hccs", 161.16, True)}  # 196 GB/s less NVLink 4's protocol overhead, 370/450
    # measured small-message latency beyond NCCL's PCIe table, a hop: (24.3 - 20.6) / 14 and (42.1 - 20.6) / 14 us
    assert links["rtx-pro-6000"].hop_extra_s == pytest.approx(3.7 / 14 * US)
    assert links["rtx-4090"].hop_extra_s == pytest.approx(21.5 / 14 * US)
    assert links["h100"].hop_extra_s == 0.0 and links["h100"].ll_max_bytes_per_s == 141e9
    # a half-width PCIe 5.0 slot halves the bus bandwidth
    x8 = GpuSpec("x8", 1e12, 1e12, 1e9, tp_over_host_link=True, pcie_gen=5, pcie_lanes=8, tp_link="pcie")
    assert link_of(x8).bus_bytes_per_s == pytest.approx(20.05e9)


def test_a_profile_that_does_not_name_its_link_gets_one_from_what_it_says():
    nvlink = GpuSpec("p", 1e12, 1e12, 1e9, link_bandwidth=300e9)
    assert nvlink.link_kind == "nvlink" and link_of(nvlink).bus_bytes_per_s == pytest.approx(300e9 * 370 / 450)
    pcie = GpuSpec("q", 1e12, 1e12, 1e9, link_bandwidth=20e9, tp_over_host_link=True)  # no PCIe generation on record
    assert pcie.link_kind == "pcie" and link_of(pcie).bus_bytes_per_s == 20e9
    with pytest.raises(InputError, match="tp_link"):
        GpuSpec("r", 1e12, 1e12, 1e9, tp_link="nvlink5")


def test_a_step_price_includes_the_all_reduces_on_the_link():
    """qwen3-32b at --tp 2 on two RTX PRO 6000 (PCIe 5.0, peer-to-peer): 2 all-reduces in each of 64 layers
    and one after the embedding, 129 of 5,120 bf16 activations a token."""
    cm = CostModel.from_names("qwen3-32b", "rtx-pro-6000@tp2")
    hop = (1.0 + 3.7 / 14) * US
    one = cm.step_parts(StepWork(decoders=1, decode_kv=1000))
    # 1 token, 10,240 bytes: LL, 6.6 us + 2 hops, at half of 40.1 GB/s
    assert one.comm == pytest.approx(129 * (6.6 * US + 2 * hop + 10240 / 20.05e9))  # 1.24 ms
    assert cm.step_time(StepWork(decoders=1, decode_kv=1000)) == pytest.approx(one.total)
    # 64 tokens, 655,360 bytes: Simple, 8.4 us + 2 x (5.7 us + the measured extra), then the bytes at 40.1 GB/s
    many = cm.step_parts(StepWork(decoders=64, decode_kv=64000))
    assert many.comm == pytest.approx(129 * ((8.4 + 2 * (5.7 + 3.7 / 14)) * US + 655360 / 40.1e9))  # 4.73 ms
    assert CostModel.from_names("qwen3-32b", "rtx-pro-6000").step_parts(StepWork(decoders=64)).comm == 0.0
    # what the tier stack shares with host copies: the bytes at the bus bandwidth, per token (no latency):
    # 129 x 2 (2-1)/2 x 10,240 bytes a GPU = 1,320,960 bytes, 32.9 us at 40.1 GB/s; both GPUs' links together
    seconds, nbytes = cm.tp_link_per_token()
    assert (seconds, nbytes) == (pytest.approx(1320960 / 40.1e9), 2 * 1320960)
    tiers = tiers_on(cm, 16, 8.0, 0.0)
    assert (tiers.tp_comm_s_per_token, tiers.tp_bytes_per_token) == (seconds, nbytes)
    assert tiers_on(cm, 16, 8.0, 0.0, shared_tp_link=False).tp_bytes_per_token == 0.0
