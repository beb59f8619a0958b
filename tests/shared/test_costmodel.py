import pytest

from shared.costmodel import GPUS, MODELS, CostModel, get_gpu, get_model
from shared.errors import InputError, UnknownNameError


def test_llama3_70b_fp16_kv_bytes_per_token():
    assert get_model("llama-3-70b").kv_bytes_per_token == 327_680


def test_presets_exist():
    for name in ("llama-3-8b", "llama-3-70b", "qwen3-8b", "qwen3-coder-30b-a3b"):
        assert name in MODELS
    for name in ("a100-80gb", "h100", "h200", "ascend-910b2"):
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


def test_block_cost_grows_with_depth_and_sums_to_prefill():
    cm = CostModel.from_names("qwen3-coder-30b-a3b", "h200")
    costs = [cm.block_cost(i, 16) for i in range(8)]
    assert all(b > a for a, b in zip(costs, costs[1:]))
    assert sum(costs) == pytest.approx(cm.prefill_time(128, 0))


def test_decode_step_is_memory_bound_for_small_batches():
    cm = CostModel.from_names("llama-3-8b", "h100")
    t1 = cm.decode_step_time(1, 1000)
    weights_only = get_model("llama-3-8b").weight_bytes / (get_gpu("h100").hbm_bandwidth * cm.mbu_decode)
    assert t1 == pytest.approx(weights_only, rel=0.05)
    assert cm.decode_step_time(8, 100_000) > t1
    assert cm.decode_step_time(0, 0) == 0.0


def test_unknown_names_list_valid_ones():
    with pytest.raises(UnknownNameError) as err:
        get_model("gpt-9")
    assert "llama-3-70b" in str(err.value)
    with pytest.raises(UnknownNameError) as err:
        get_gpu("tpu")
    assert "h200" in str(err.value)
    assert get_gpu("H200").name == "h200"  # case-insensitive
