"""vLLM's memory rule (shared/memory_rule.py), worked by hand term by term."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from shared.costmodel import CostModel, get_gpu, get_model
from shared.errors import InputError

GIB, MIB = 1024**3, 1024**2


def test_llama_3_1_8b_on_the_rtx_4090_of_the_shipped_run_worked_by_hand():
    # total: what CUDA gave vLLM on the run (meta.json), not nvidia-smi's 24,564 MiB
    requested = math.ceil(0.9 * 25_250_627_584)
    assert requested == 22_725_564_826
    # weights: 32 layers of fused QKV + output + SwiGLU, untied embedding and LM head, 65 RMSNorms,
    # and the rotary cos/sin cache of 131,072 positions x 128 in bf16 (32 MiB)
    params = 32 * (4096 * 48 * 128 + 32 * 128 * 4096 + 3 * 4096 * 14336) + 2 * 128256 * 4096 + 65 * 4096
    assert params == 8_030_261_248  # Llama-3.1-8B's parameter count
    weights = 2 * params + 131072 * 128 * 2
    assert weights == 16_094_076_928  # vLLM: "Model loading took 14.99 GiB"
    # activations: the larger of the forward (2,048 tokens x bf16 x (2 x 4096 + 3 x 14336)) and the
    # sampler run (256 rows x 128,256 x 28 bytes, beside the forward's 2,048 x 4096 bf16 output)
    forward = 2048 * 2 * (2 * 4096 + 3 * 14336)
    sampler = 2048 * 4096 * 2 + 256 * 128256 * 28
    assert (forward, sampler) == (209_715_200, 936_116_224)
    non_torch = 0.25 * GIB
    kv = requested - weights - sampler - non_torch
    assert kv == 5_426_936_218
    b = CostModel.from_names("llama-3.1-8b", "rtx-4090").kv_budget(0.9, 2048, 256, 16)
    assert (b.requested_bytes, b.weight_bytes, b.forward_bytes, b.sampler_bytes) == (requested, weights, forward,
                                                                                       sampler)
    assert (b.activation_bytes, b.non_torch_bytes, b.graph_bytes, b.kv_bytes) == (sampler, non_torch, 0.0, kv)
    block = 2 * 32 * 8 * 128 * 2 * 16  # K and V of 32 layers, 8 KV heads of 128, bf16, 16 tokens: 2 MiB
    assert b.blocks == kv // block == 2587 and b.check() == 2587  # vLLM reported 2,588
    assert b.line().endswith("- 0.25 GiB non-torch = 5.05 GiB of KV per GPU: 2,587 blocks of 16 tokens")


def test_llama_3_1_70b_at_tp_4_on_h100s_and_the_breakdown_by_term():
    m = replace(get_model("llama-3-70b"), name="llama-3.1-70b", max_context=131072)
    cost = CostModel(m, get_gpu("h100"), tp=4)
    requested = math.ceil(0.9 * 85_029_158_912)
    params = 80 * (8192 * 80 * 128 + 64 * 128 * 8192 + 3 * 8192 * 28672) + 2 * 128256 * 8192
    weights = 2 * params / 4 + 2 * 161 * 8192 + 131072 * 128 * 2  # norms and rotary cache whole on each GPU
    page = 2 * 80 * 2 * 128 * 2 * 16  # one block on one GPU: 2 of the 8 KV heads
    for tokens, expected in ((2048, 28_971), (8192, 28_894)):
        sampler = tokens * 8192 * 2 + 256 * 128256 * 28
        kv = requested - weights - sampler - 2.13 * GIB
        b = cost.kv_budget(0.9, tokens, 256, 16)
        assert (b.weight_bytes, b.activation_bytes, b.non_torch_bytes) == (weights, sampler, 2.13 * GIB)
        assert b.blocks == int(kv // page) == expected  # deployments reported 30,425 and 30,251
    assert b.breakdown()["terms"] == ("weights", "activations", "non-torch memory")
    with pytest.raises(InputError) as err:
        CostModel(m, get_gpu("h100")).kv_budget(0.9, 8192, 256, 16).check()
    assert err.value.field == "--gpu-memory-utilization" and "nothing left for KV" in str(err.value)
    for bad in (0.0, 1.5, float("nan")):
        with pytest.raises(InputError):
            cost.kv_budget(bad, 8192, 256, 16)


def test_a_card_without_a_measured_total_takes_nvidia_smis_less_the_drivers_share():
    b = CostModel.from_names("llama-3-8b", "h200").kv_budget(0.9, 8192, 256, 16)
    assert b.device_bytes == (143771 - 476) * MIB and "estimated" in b.device_source
