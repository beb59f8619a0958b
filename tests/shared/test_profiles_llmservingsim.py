"""LLMServingSim's operator profile (the RTX 4090 one shipped in bench/data/llmservingsim) read as whole steps."""

from pathlib import Path

import pytest

from shared.costmodel import get_model
from shared.profiles_llmservingsim import parse_meta, read_profile, skew_errors, steps

PROFILE = Path(__file__).resolve().parents[2] / "bench" / "data" / "llmservingsim"
VLLM_KV_TOKENS = 2588 * 16  # the blocks vLLM 0.19 reported for the run on this GPU, x 16 tokens


@pytest.fixture(scope="module")
def profile():
    return read_profile(str(PROFILE), tp=1)


def test_the_meta_file_reads_as_yaml_would(profile):
    meta = profile.meta
    assert profile.folder.endswith("perf/RTX4090/meta-llama/Llama-3.1-8B/bf16")
    assert meta["gpu"] == "NVIDIA GeForce RTX 4090" and meta["cuda_version"] == "12.8"  # quoted: a string
    assert meta["tp_degrees"] == [1] and meta["engine_effective"]["enforce_eager"] is True
    assert meta["engine_effective"]["hf_overrides"] == {"num_hidden_layers": 1, "intermediate_size": 14336,
                                                        "num_attention_heads": 32, "num_key_value_heads": 8,
                                                        "vocab_size": 128256}
    assert meta["attention_grid"]["chunks"] == "0, 16-2048 x2"
    assert profile.limits == (2048, 256)
    assert parse_meta("a:\n  b: [1, 2]\n  c: 'x: y'\nd: 0.5\n", "m") == {"a": {"b": [1, 2], "c": "x: y"}, "d": 0.5}


def test_a_step_is_the_operators_summed_as_llmservingsim_sums_them(profile):
    """One decoder over 16 KV tokens, from the rows of the files (microseconds): per layer the attention
    (0,0,1,16) 9.31067, both RMSNorms 2 x 1.85083, qkv_proj 54.898, rotary_emb 2.17567, o_proj 38.1313,
    gate_up_proj 247.292, act_fn 2.592, down_proj 126.766 = 484.8673, times 32 layers = 15,515.7536; once:
    embedding 2.837, final_layernorm 1.94167, lm_head at 1 sequence 1,096.93, sampler 25.001 = 1,126.70967."""
    by_kind = steps(profile, get_model("llama-3.1-8b"), VLLM_KV_TOKENS)
    one = next(p for p in by_kind["decode"] if p.contexts == (16,))
    assert one.seconds == pytest.approx((15515.7536 + 1126.70967) * 1e-6, rel=1e-9)
    # a 16-token chunk beside one decoder: the attention row (16,0,1,16), every operator at 17 tokens
    # (dense.csv has 16 and 20: a quarter of the way), the head and sampler at 2 sequences
    mixed = next(p for p in by_kind["mixed"] if p.chunks == ((16, 0),) and p.contexts == (16,))
    assert mixed.seconds > one.seconds
    # The grid a serving run of the profiled engine could run within vLLM's 41,408 KV tokens: every
    # prefill (8 chunk sizes x 12 prefix depths, at most 18,432 tokens); decoders 1, 2, ..., 256 at 16 to
    # 16,384 tokens each with batch x context <= 41,408: 11 + 11 + 10 + 9 + 8 + 7 + 6 + 5 + 4
    assert len(by_kind["prefill"]) == 96 and len(by_kind["decode"]) == 71
    # a 2,048-token chunk fills max_num_batched_tokens alone: no decoder beside it
    assert {p.chunks[0][0] for p in by_kind["mixed"]} == {16, 32, 64, 128, 256, 512, 1024}
    assert all(sum(p.contexts) + sum(n + c for n, c in p.chunks) <= VLLM_KV_TOKENS for p in by_kind["mixed"])


def test_uneven_contexts_are_compared_within_skew_csv(profile):
    """First row: 2 decoders at 128 and 512 (mean 320): 52.128 us at the mean, 53.343 us as measured."""
    errs = skew_errors(profile, VLLM_KV_TOKENS)
    assert errs[0] == pytest.approx(52.128 / 53.343 - 1)
    assert 0 < len(errs) < 13009  # the file's rows: those over the KV capacity are left out
