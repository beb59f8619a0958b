import json
from pathlib import Path

import pytest

from shared.costmodel import CostModel, Efficiency, GpuSpec, StepWork, get_gpu, get_model
from shared.errors import InputError, UnknownNameError
from shared.gpu_presets import GPUS
from shared.model_presets import MODELS


def test_llama3_70b_fp16_kv_bytes_per_token():
    assert get_model("llama-3-70b").kv_bytes_per_token == 327_680


def test_presets_exist():
    for name in ("llama-3-8b", "llama-3-70b", "qwen3-8b", "qwen3-coder-30b-a3b", "llama-3.1-8b", "qwen3-32b",
                 "qwen3-30b-a3b"):
        assert name in MODELS
    for name in ("a100-80gb", "h100", "h200", "ascend-910b2", "rtx-4090", "rtx-pro-6000", "l40s", "h100-pcie"):
        assert name in GPUS


def test_seed_002_calibration_within_15_percent():
    cm = CostModel.from_names("qwen3-coder-30b-a3b", "h200")
    scratch = cm.prefill_time(8192, 0)
    deep = cm.prefill_time(8192, 65536)
    assert scratch == pytest.approx(0.166, rel=0.15)
    assert deep == pytest.approx(0.966, rel=0.15)
    linear, attn = cm.prefill_flops(8192, 0)
    assert (linear + attn) == pytest.approx(71.1e12, rel=0.15)
    linear, attn = cm.prefill_flops(8192, 65536)
    assert (linear + attn) == pytest.approx(493.3e12, rel=0.15)


def test_gib_blocks_round_trip():
    cm = CostModel.from_names("llama-3-70b", "h100")
    # one 16-token block of Llama-3-70B is 5 MiB exactly
    assert cm.block_bytes(16) == 5 * 1024 * 1024
    assert cm.gib_to_blocks(1, 16) == 204
    assert cm.blocks_to_gib(204, 16) == pytest.approx(0.99609375)
    with pytest.raises(InputError):
        cm.gib_to_blocks(-1, 16)


def test_block_cost_grows_with_depth_and_sums_to_a_long_prefill():
    cm = CostModel.from_names("qwen3-coder-30b-a3b", "h200")
    costs = [cm.block_cost(i, 16) for i in range(512)]
    assert all(b > a for a, b in zip(costs, costs[1:]))
    # A block's cost is its share of the compute: 512 blocks are the 8K prefill minus its
    # per-call costs (no cached prefix, compute-bound: no weight-read or prefix-read term).
    # The MoE layers' share: their products (8K tokens: compute-bound), not their fixed cost, 17.04 us a layer.
    parts = cm.prefill_parts(8192, 0)
    assert parts.linear > parts.weights and parts.kv_read == 0.0
    assert sum(costs) == pytest.approx(parts.linear + parts.attention + parts.moe - 48 * 17.04e-6)


def test_decode_step_is_memory_bound_for_small_batches():
    cm = CostModel.from_names("llama-3-8b", "h100")
    t1 = cm.decode_step_time(1, 1000)
    m = get_model("llama-3-8b")
    # every layer and the LM head, not the input embedding (a step gathers one row of it a token)
    layers_and_head = (m.layers * m.layer_params() + m.vocab * m.hidden) * 2
    weights_only = layers_and_head / (get_gpu("h100").hbm_bandwidth * cm.efficiency.memory)
    assert t1 == pytest.approx(weights_only, rel=0.05)
    assert cm.decode_step_time(8, 100_000) > t1
    assert cm.decode_step_time(0, 0) == 0.0


def test_a_small_batch_decode_step_hand_worked_llama_3_8b_on_h200():
    """Batch 1 over 1,024 KV tokens: 32 layers of 218,103,808 parameters and the LM head (128,256
    x 4,096), bf16, at 0.80 x 4.8 TB/s; the KV, 1,024 x 131,072 bytes, at the same rate; and a
    graph replay's 11 kernel nodes at 0.5 us, 5.5 us a layer (the step is decode-only)."""
    cm = CostModel.from_names("llama-3-8b", "h200")
    read = (32 * 218_103_808 + 128256 * 4096) * 2  # 15,009,316,864 bytes: not the input embedding
    assert read == 15_009_316_864
    weights, kv, fixed = read / 3.84e12, 1024 * 131_072 / 3.84e12, 32 * 11 * 0.5e-6
    assert cm.efficiency.decode_overhead_s == pytest.approx(5.5e-6)
    assert cm.decode_step_time(1, 1024) == pytest.approx(weights + kv + fixed)  # 3.9087 + 0.0350 + 0.176 ms
    assert cm.decode_step_time(1, 1024) == pytest.approx(4.1196e-3, abs=1e-7)
    # batch 4 at 1K each: four times the KV, the same weights and fixed cost
    assert cm.decode_step_time(4, 4096) == pytest.approx(weights + 4 * kv + fixed)
    # tied embeddings change what is resident, not what a step reads: OPT's head is its embedding
    opt = get_model("opt-13b")
    assert CostModel(opt, get_gpu("h200")).step_parts(StepWork(decoders=1)).weights == pytest.approx(
        (40 * opt.layer_params() + opt.head_params) * 2 / 3.84e12)
    # an eager step (a prefill of more than 512 tokens) pays 51 us a layer instead
    parts = cm.prefill_parts(1024, 0)
    assert parts.overhead == pytest.approx(32 * 5.09e-5)
    assert cm.prefill_parts(512, 0).overhead == pytest.approx(fixed)


def test_preset_shapes_give_the_published_parameter_counts():
    assert get_model("llama-3-8b").total_params == pytest.approx(8.03e9, rel=0.01)
    assert get_model("llama-3-70b").total_params == pytest.approx(70.6e9, rel=0.01)
    assert get_model("qwen3-8b").total_params == pytest.approx(8.19e9, rel=0.01)
    assert get_model("llama-2-13b").total_params == pytest.approx(13.0e9, rel=0.01)
    assert get_model("llama-2-70b").total_params == pytest.approx(69.0e9, rel=0.01)
    # OPT: a two-matrix MLP of 4 x hidden, the LM head tied to the embedding (counted once);
    # the published 12.85B / 29.97B also hold biases, norms and 2,050 learned positions (<0.1%)
    opt13, opt30 = get_model("opt-13b"), get_model("opt-30b")
    assert opt13.tied_embeddings and opt13.mlp_matrices == 2 and opt13.intermediate == 4 * opt13.hidden
    assert opt13.total_params == pytest.approx(12.85e9, rel=0.005)
    assert opt30.total_params == pytest.approx(29.97e9, rel=0.005)
    assert opt13.total_params == 40 * (4 * 5120 * 5120 + 2 * 5120 * 20480) + 50272 * 5120
    assert get_model("llama-3.1-8b").total_params == pytest.approx(8.03e9, rel=0.01)
    assert get_model("qwen3-32b").total_params == pytest.approx(32.8e9, rel=0.01)
    assert get_model("qwen3-30b-a3b").total_params == pytest.approx(30.5e9, rel=0.01)
    moe = get_model("qwen3-coder-30b-a3b")
    assert moe.total_params == pytest.approx(30.5e9, rel=0.01)
    # parameters one token touches: every layer with its active experts, and the LM head
    active = moe.layers * moe.layer_params(moe.active_experts) + moe.head_params
    assert active == pytest.approx(3.3e9, rel=0.1)
    # 8 of 128 experts a token: one token touches 8, 8K tokens touch (nearly) all 128
    assert moe.touched_experts(1) == pytest.approx(8.0)
    assert moe.touched_experts(8192) == pytest.approx(128.0)


def test_gpu_memory_is_what_the_device_reports():
    mib = 1024**2
    assert get_gpu("a100-80gb").memory_bytes == 81920 * mib
    assert get_gpu("h100").memory_bytes == 81559 * mib
    assert get_gpu("h200").memory_bytes == 143771 * mib
    assert get_gpu("ascend-910b2").memory_bytes == 65536 * mib
    assert get_gpu("rtx-4090").memory_bytes == 24564 * mib
    assert get_gpu("rtx-pro-6000").memory_bytes == 97887 * mib
    assert get_gpu("l40s").memory_bytes == 46068 * mib
    assert get_gpu("h100-pcie").memory_bytes == 81559 * mib


def test_cards_without_nvlink_price_the_tp_all_reduce_over_their_pcie_link():
    # datasheet rates: dense BF16 (FP32 accumulate) and memory bandwidth
    assert [(get_gpu(g).peak_flops, get_gpu(g).hbm_bandwidth) for g in ("rtx-4090", "rtx-pro-6000", "l40s", "h100-pcie")] \
        == [(165.2e12, 1.008e12), (480e12, 1.597e12), (362.05e12, 0.864e12), (756e12, 2.0e12)]
    for name, gen, p2p in (("rtx-4090", 4, False), ("rtx-pro-6000", 5, True), ("l40s", 4, True), ("h100-pcie", 5, True)):
        g = get_gpu(name)
        assert (g.tp_over_host_link, g.pcie_gen, g.pcie_lanes, g.peer_to_peer) == (True, gen, 16, p2p)
        assert g.link_bandwidth == g.host_bandwidth == (25e9 if gen == 4 else 55.5e9)
    # PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 / 8 bits = 31.51 GB/s a direction; 5.0 twice that
    assert get_gpu("l40s").pcie_bytes_per_s == pytest.approx(31.5077e9, rel=1e-5)
    assert get_gpu("h100-pcie").pcie_bytes_per_s == 2 * get_gpu("l40s").pcie_bytes_per_s
    assert get_gpu("h200").pcie_gen == 5 and not get_gpu("h200").tp_over_host_link
    # llama-3.1-8b at --tp 2 on an RTX 4090 (no peer-to-peer: through host memory): 65 all-reduces (two a layer,
    # one after the embedding) of 4,096 bf16 activations a token; one token's goes LL, 6.6 us + 2 hops of
    # 1.0 us + the measured 21.5 / 14 us, at half of 13 GB/s: 12.9 us each, 0.84 ms a step (NVLink: 0.51 ms)
    comm = CostModel.from_names("llama-3.1-8b", "rtx-4090@tp2").step_parts(StepWork(decoders=1)).comm
    assert comm == pytest.approx(65 * ((6.6 + 2 * (1.0 + 21.5 / 14)) * 1e-6 + 8192 / 6.5e9))
    with pytest.raises(InputError, match="pcie_gen"):
        GpuSpec("x", 1e12, 1e12, 1e9, pcie_gen=7)


def test_moe_decode_reads_only_the_experts_the_batch_touches():
    cm = CostModel.from_names("qwen3-coder-30b-a3b", "h200")
    m = cm.model
    # batch 1: every non-expert weight and the LM head at `memory`; then 48 fused-MoE layers over the 8 experts
    # one token touches: 17.04 us each and 8 experts of 4,718,592 bf16 parameters at 0.822 x 4.8 TB/s
    dense = (m.weight_bytes - m.vocab * m.hidden * 2 - m.layers * 128 * m.expert_params * 2) / (4.8e12 * cm.efficiency.memory)
    moe = 48 * (17.04e-6 + 8 * 4_718_592 * 2 / (0.822 * 4.8e12))
    assert cm.decode_step_time(1, 0) == pytest.approx(dense + moe)


def test_prefill_roofline_hand_worked_llama_3_8b():
    """512 new tokens after 64K cached, llama-3-8b on an H200 with efficiencies of 1/2."""
    cm = CostModel(get_model("llama-3-8b"), get_gpu("h200"), Efficiency(0.5, 0.5, 0.5, 0.5, 1e-5, 0.0, graph_tokens=0))
    layer_params = 4096 * 48 * 128 + 32 * 128 * 4096 + 3 * 4096 * 14336  # 218,103,808
    head = 128256 * 4096
    p = cm.prefill_parts(512, 65536)
    assert p.linear == pytest.approx(2 * 512 * 32 * layer_params / (989e12 / 2))
    assert p.head == pytest.approx(2 * head / (989e12 / 2))  # the LM head, for the one sequence
    assert p.weights == pytest.approx((32 * layer_params + head) * 2 / (4.8e12 / 2))
    assert p.attention == pytest.approx(4 * 32 * 128 * 32 * (512 * 65536 + 512 * 511 / 2) / (989e12 / 2))
    assert p.kv_read == pytest.approx(32 * 65536 * 2 * 32 * 128 * 2 / (4.8e12 / 2))
    assert cm.prefill_time(512, 65536) == pytest.approx(p.linear + p.head + p.attention + p.kv_read + 32e-5)
    # 4 tokens: the weights take longer to read than the products take to compute
    small = cm.prefill_parts(4, 0)
    assert small.weights > small.linear
    assert cm.prefill_time(4, 0) == pytest.approx(small.weights + small.attention + 32e-5)
    # a step of at most graph_tokens tokens replays a CUDA graph: decode_overhead_s, not overhead_s
    graphed = cm.with_efficiency(Efficiency(0.5, 0.5, 0.5, 0.5, 1e-5, 2e-6, graph_tokens=4))
    assert graphed.prefill_time(4, 0) == pytest.approx(small.weights + small.attention + 32 * 2e-6)
    assert graphed.prefill_time(5, 0) == pytest.approx(graphed.prefill_parts(5, 0).weights
                                                        + graphed.prefill_parts(5, 0).attention + 32e-5)


def test_tensor_parallel_splits_the_work_and_adds_the_all_reduces():
    one = CostModel.from_names("llama-3-70b", "h200")
    two = CostModel.from_names("llama-3-70b", "h200@tp2")
    assert two.tp == 2
    p1, p2 = one.prefill_parts(8192, 0), two.prefill_parts(8192, 0)
    assert p2.linear == pytest.approx(p1.linear / 2)
    # two prompts of 4096 in one step: the all-reduces are over all 8192 tokens, as one of 8192
    two_chunks = two.step_parts(StepWork.of([(4096, 0), (4096, 0)]))
    assert two_chunks.comm == pytest.approx(p2.comm)
    assert p2.attention == pytest.approx(p1.attention / 2)
    # 161 all-reduces (2 in each of 80 layers, 1 after the embedding) of 8192 x 8192 x 2 bytes over NVLink 4:
    # NCCL's Simple ring, 8.4 + 2 x 3.4 us, then 2(tp-1)/tp of the bytes at the measured 370 GB/s
    assert p2.comm == pytest.approx(161 * (15.2e-6 + 1 * 8192 * 8192 * 2 / 370e9))
    assert one.prefill_time(8192) / 2 < two.prefill_time(8192) < one.prefill_time(8192)
    with pytest.raises(InputError, match="tp"):
        CostModel.from_names("llama-3-70b", "h200@tp0")


def test_dense_preset_within_15_percent_of_the_h200_measurements():
    """The shipped dense efficiencies against the measured llama-3-8b layer stack (docs/calibration/)."""
    raw = json.loads((Path(__file__).resolve().parents[2] / "docs" / "calibration" / "h200-llama-3-8b.json").read_text())
    cm = CostModel.from_names("llama-3-8b", "h200")
    errs = [abs(cm.prefill_time(p["new_tokens"], p["cached_depth"]) / p["seconds"] - 1) for p in raw["prefill"]]
    assert len(errs) == 7
    assert sum(errs) / len(errs) < 0.02
    assert max(errs) == pytest.approx(0.0278, abs=1e-4)  # 8192 over 16K cached
    assert max(errs) < 0.04


def test_unknown_names_list_valid_ones():
    with pytest.raises(UnknownNameError) as err:
        get_model("gpt-9")
    assert "llama-3-70b" in str(err.value)
    with pytest.raises(UnknownNameError) as err:
        get_gpu("tpu")
    assert "h200" in str(err.value)
    assert get_gpu("H200").name == "h200"  # case-insensitive


@pytest.mark.parametrize("model", ["llama-3-8b", "qwen3-coder-30b-a3b"])
@pytest.mark.parametrize("gpu", ["h200", "a100@tp4"])
def test_the_fast_prefill_time_equals_the_sum_of_its_parts(model, gpu):
    cm = CostModel.from_names(model, gpu)
    for n, c in ((1, 0), (3, 70), (16, 4096), (512, 65536), (8192, 0)):
        assert cm.prefill_time(n, c) == pytest.approx(cm.prefill_parts(n, c).total, rel=1e-12)
    assert cm.prefill_time(0, 100) == 0.0
    with pytest.raises(InputError):
        cm.prefill_time(-1, 0)


def test_host_copies_match_the_h200_link_measurements():
    """docs/calibration/h200-llama-3-8b.json: 55.5 GB/s whole, 51.1 GB/s in 512 copies of 2 MiB
    (a 16-token block of llama-3-8b), 10.3 GB/s in 4096 copies of 64 KiB."""
    cm = CostModel.from_names("llama-3-8b", "h200")
    assert cm.block_bytes(16) == 2 * 1024 * 1024
    gpu = cm.gpu
    # the host link's price (what the tier stack's links charge): bytes / bandwidth + calls x overhead
    nbytes = 512 * cm.block_bytes(16)
    rate = nbytes / (nbytes / gpu.host_bandwidth + 512 * gpu.host_copy_overhead_s)
    assert rate == pytest.approx(51.1e9, rel=0.05)
    whole = nbytes / (nbytes / gpu.host_bandwidth + gpu.host_copy_overhead_s)
    assert whole == pytest.approx(55.5e9, rel=0.01)
    t64k = 4096 * 65536 / gpu.host_bandwidth + 4096 * gpu.host_copy_overhead_s
    assert 4096 * 65536 / t64k == pytest.approx(10.3e9, rel=0.05)



def test_every_preset_has_its_published_context_window():
    assert {name: m.max_context for name, m in MODELS.items()} == {
        "llama-3-8b": 8192, "llama-3-70b": 8192, "qwen3-8b": 40960, "llama-2-13b": 4096, "llama-2-70b": 4096,
        "opt-13b": 2048, "opt-30b": 2048, "qwen3-coder-30b-a3b": 262144, "tiny": 32768, "tiny-moe": 32768,
        "llama-3.1-8b": 131072, "qwen3-32b": 40960, "qwen3-30b-a3b": 40960, "deepseek-v3": 163840,
        "gpt-oss-120b": 131072, "gemma-3-27b": 131072, "qwen3-next-80b-a3b": 262144}
