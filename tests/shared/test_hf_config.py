"""Models from a Hugging Face config.json: the published configs read into exactly their presets' shapes,
and what kvemu cannot model yet refused in one line naming the field and the file."""

import json
import os

import pytest

from kvemu.options.replica_flags import MODEL, model_arg
from shared.costmodel import CostModel, get_model
from shared.errors import InputError, UnknownNameError
from shared.hf_config import load_config, model_name
from shared.model_presets import DENSE_H200, MODELS

# meta-llama/Llama-3.1-8B's config.json, the fields that size the model
LLAMA_31_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
               "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "vocab_size": 128256, "max_position_embeddings": 131072, "tie_word_embeddings": False,
               "torch_dtype": "bfloat16",
               "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
QWEN3_32B = {"architectures": ["Qwen3ForCausalLM"], "head_dim": 128, "hidden_size": 5120, "intermediate_size": 25600,
             "max_position_embeddings": 40960, "max_window_layers": 64, "model_type": "qwen3", "num_attention_heads": 64,
             "num_hidden_layers": 64, "num_key_value_heads": 8, "rope_scaling": None, "sliding_window": None,
             "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936}
QWEN3_30B_A3B = {"architectures": ["Qwen3MoeForCausalLM"], "decoder_sparse_step": 1, "head_dim": 128,
                 "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
                 "mlp_only_layers": [], "model_type": "qwen3_moe", "moe_intermediate_size": 768,
                 "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
                 "num_key_value_heads": 4, "rope_scaling": None, "sliding_window": None, "tie_word_embeddings": False,
                 "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 151936}
OPT_13B = {"architectures": ["OPTForCausalLM"], "do_layer_norm_before": True, "ffn_dim": 20480, "hidden_size": 5120,
           "max_position_embeddings": 2048, "model_type": "opt", "num_attention_heads": 40, "num_hidden_layers": 40,
           "torch_dtype": "float16", "vocab_size": 50272, "word_embed_proj_dim": 5120}
QWEN25_7B = {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
             "max_position_embeddings": 32768, "max_window_layers": 28, "num_attention_heads": 28,
             "num_hidden_layers": 28, "num_key_value_heads": 4, "sliding_window": 131072, "tie_word_embeddings": False,
             "torch_dtype": "bfloat16", "use_sliding_window": False, "vocab_size": 152064}
MISTRAL_7B_V01 = {"architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
                  "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32,
                  "num_key_value_heads": 8, "sliding_window": 4096, "torch_dtype": "bfloat16", "vocab_size": 32000}

# deepseek-ai/DeepSeek-V3's config.json as published (bench/data/models/README.md)
DEEPSEEK_V3_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "data", "models", "deepseek-v3",
                                "config.json")
with open(DEEPSEEK_V3_PATH, encoding="utf-8") as _fh:
    DEEPSEEK_V3 = json.load(_fh)


def _write(tmp_path, config: dict, name: str = "config.json", folder: str = "model") -> str:
    path = tmp_path / folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return str(path)


def test_llama_3_1_8b_config_is_the_preset_with_its_kv_bytes(tmp_path):
    m = get_model(_write(tmp_path, LLAMA_31_8B, "Llama-3.1-8B.config.json"))
    assert m == MODELS["llama-3.1-8b"]  # every field: shape, window, dtype, efficiencies, name
    # 2 (K and V) x 32 layers x 8 KV heads x 128 head_dim x 2 bytes (bfloat16)
    assert m.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    # llama3 rope scaling is already in max_position_embeddings: vLLM's default max-model-len is it
    assert m.max_context == 131_072


@pytest.mark.parametrize(("config", "preset", "kv_bytes"), [
    (QWEN3_32B, "qwen3-32b", 2 * 64 * 8 * 128 * 2),  # head_dim 128 as given, not 5120 / 64 = 80
    (QWEN3_30B_A3B, "qwen3-30b-a3b", 2 * 48 * 4 * 128 * 2),  # 128 experts of 768, 8 a token
    (OPT_13B, "opt-13b", 2 * 40 * 40 * 128 * 2),  # multi-head, two-matrix MLP, tied by OPT's default
])
def test_published_configs_read_into_their_presets(tmp_path, config, preset, kv_bytes):
    m = get_model(_write(tmp_path, config))
    assert m == MODELS[preset] and m.kv_bytes_per_token == kv_bytes


def test_a_model_without_a_preset_takes_its_folders_name_and_the_dense_fit(tmp_path):
    path = _write(tmp_path, QWEN25_7B, folder="Qwen2.5-7B-Instruct")
    m = get_model(path)
    # head_dim 3584 / 28 = 128; the sliding_window is off (use_sliding_window false)
    assert (m.name, m.layers, m.q_heads, m.kv_heads, m.head_dim, m.hidden, m.intermediate, m.vocab) == \
        ("Qwen2.5-7B-Instruct", 28, 28, 4, 128, 3584, 18944, 152064)
    assert (m.experts, m.mlp_matrices, m.tied_embeddings, m.max_context, m.efficiency) == (0, 3, False, 32768, DENSE_H200)
    assert m.kv_bytes_per_token == 2 * 28 * 4 * 128 * 2 == 57_344
    # the published 7.61B: 28 x (attention 29,360,128 + MLP 203,685,888) + 2 x 152,064 x 3,584
    assert m.total_params == 28 * (29_360_128 + 203_685_888) + 2 * 152_064 * 3584 == 7_615_283_200
    # a folder holding config.json is the same model; so is the CLI's absolute path of a relative one
    assert get_model(os.path.dirname(path)) == m
    cost = CostModel.from_names(path, "rtx-4090")
    assert cost.model == m and cost.gpu.name == "rtx-4090"


def test_rope_scaling_that_stretches_the_window_multiplies_it_as_vllm_does(tmp_path):
    yarn = dict(QWEN3_32B, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    assert get_model(_write(tmp_path, yarn)).max_context == 131_072  # 32,768 x 4
    linear = dict(QWEN3_32B, rope_scaling={"type": "linear", "factor": 2.0})
    assert get_model(_write(tmp_path, linear, folder="linear")).max_context == 81_920


def test_names_from_where_the_file_lies():
    snapshot = "/hf/hub/models--Qwen--Qwen3-14B/snapshots/" + "a" * 40 + "/config.json"
    assert model_name(snapshot) == "Qwen3-14B"
    assert model_name("/m/Qwen3-14B/config.json") == "Qwen3-14B"
    assert model_name("/m/Llama-3.1-8B.config.json") == "Llama-3.1-8B"
    assert model_name("/m/mine.json") == "mine"


def test_sliding_window_layers_read_into_kv_cache_groups_and_size_a_block_by_one_group(tmp_path):
    # a gpt-oss-like config: alternating 128-token windows and full layers, 4 layers, 8 KV heads of 64
    oss = {"architectures": ["GptOssForCausalLM"], "hidden_size": 512, "intermediate_size": 256, "head_dim": 64,
           "num_attention_heads": 16, "num_key_value_heads": 8, "num_hidden_layers": 4, "vocab_size": 1000,
           "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 4096, "sliding_window": 128,
           "layer_types": ["sliding_attention", "full_attention"] * 2}
    path_oss = _write(tmp_path, oss, folder="oss")
    m = get_model(path_oss)
    assert m.layer_kinds == (("window", 128), ("full", 0)) * 2 and (m.experts, m.active_experts) == (8, 2)
    assert [(g.kind, g.layers, g.window) for g in m.kv_groups.groups] == [("window", 2, 128), ("full", 2, 0)]
    assert m.kv_bytes_per_token == 4 * 2 * 8 * 64 * 2 == 8192  # every layer's K and V, 16-bit
    assert CostModel.from_names(path_oss).block_bytes(16) == 2 * 2 * 8 * 64 * 2 * 16 == 65_536  # a block: one group's 2 layers
    # Gemma 3's pattern: every sixth layer global; Mistral's window on every layer is one group
    gemma = dict(LLAMA_31_8B, architectures=["Gemma3ForCausalLM"], num_hidden_layers=12, sliding_window=1024,
                 sliding_window_pattern=6)
    g = get_model(_write(tmp_path, gemma, folder="gemma")).kv_groups
    assert [(x.kind, x.layers) for x in g.groups] == [("window", 2)] * 5 + [("full", 2)]  # groups of the 2 global layers
    assert g.group_size == 2
    mistral_path = _write(tmp_path, MISTRAL_7B_V01, folder="mistral")
    mistral = get_model(mistral_path)
    assert mistral.layer_kinds == (("window", 4096),) * 32 and len(mistral.kv_groups.groups) == 1
    assert CostModel.from_names(mistral_path).block_bytes(16) == mistral.kv_bytes_per_token * 16  # one group: every layer


@pytest.mark.parametrize(("change", "expected"), [
    (dict(QWEN3_32B, use_sliding_window=True, sliding_window=4096),
     "'use_sliding_window' is true: Qwen's max_window_layers split is not modelled yet"),
    (dict(QWEN3_32B, layer_types=["full_attention", "sliding_attention"]),
     "'layer_types' must list one type for each of the 64 layers"),
    (dict(QWEN3_32B, layer_types=["full_attention", "linear_attention"] * 32),
     "'layer_types' has linear_attention in a Qwen3ForCausalLM: kvemu knows the state of Qwen3NextForCausalLM's"
     " Gated DeltaNet layers only"),
    (dict(QWEN3_32B, layer_types=["full_attention", "mamba"] * 32),
     "'layer_types' has mamba: kvemu models full_attention, sliding_attention, linear_attention (Mamba and other"
     " state layers are not modelled yet)"),
    (dict(QWEN3_32B, layer_types=["full_attention", "sliding_attention"] * 32), "'sliding_window' is missing"),
    (dict(DEEPSEEK_V3, moe_layer_freq=2), "'moe_layer_freq' is not 1: MoE layers between dense ones are not"
                                          " modelled yet"),
    ({k: v for k, v in DEEPSEEK_V3.items() if k != "qk_rope_head_dim"}, "'qk_rope_head_dim' is missing"),
    (dict(DEEPSEEK_V3, first_k_dense_replace=61), "'first_k_dense_replace' leaves no MoE layer among the 61"),
    (dict(LLAMA_31_8B, architectures=["Gemma2ForCausalLM"]),
     "'architectures' is ['Gemma2ForCausalLM']: an architecture kvemu cannot model yet; it reads LlamaForCausalLM,"
     " MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM, Gemma3ForConditionalGeneration,"
     " Qwen3MoeForCausalLM, Qwen3NextForCausalLM,"
     " GptOssForCausalLM, DeepseekV2ForCausalLM,"
     " DeepseekV3ForCausalLM, OPTForCausalLM"),
    ({k: v for k, v in LLAMA_31_8B.items() if k != "num_hidden_layers"},
     "'num_hidden_layers' is missing: kvemu needs it to size the model"),
    (dict(LLAMA_31_8B, num_key_value_heads=0), "'num_key_value_heads' must be an integer >= 1, got 0"),
    (dict(LLAMA_31_8B, num_key_value_heads=5), "'num_key_value_heads' (5) must divide num_attention_heads (32)"),
    (dict(LLAMA_31_8B, hidden_size=4100), "'head_dim' is missing and hidden_size 4100 is not a multiple of"
                                          " num_attention_heads 32"),
    (dict(LLAMA_31_8B, quantization_config={"quant_method": "awq"}),
     "'quantization_config' is set and not fp8 or mxfp4"),
    (dict(LLAMA_31_8B, quantization_config={"quant_method": "mxfp4"}),
     "'quantization_config' is mxfp4 on a model without routed experts"),
    (dict(LLAMA_31_8B, torch_dtype="float8_e4m3fn"), "'torch_dtype' is 'float8_e4m3fn'"),
    (dict(QWEN3_30B_A3B, mlp_only_layers=[48]), "'mlp_only_layers' must be a list of layer indices below 48"),
    ({k: v for k, v in QWEN3_30B_A3B.items() if k != "num_experts"}, "'num_experts' is missing"),
    (dict(OPT_13B, word_embed_proj_dim=512), "'word_embed_proj_dim' differs from hidden_size 5120"),
])
def test_what_cannot_be_modelled_is_refused_naming_the_field_and_the_file(tmp_path, change, expected):
    path = _write(tmp_path, change)
    with pytest.raises(InputError) as err:
        get_model(path)
    assert err.value.field == "--model"
    assert str(err.value).startswith(f"--model: {path}: {expected}") and "\n" not in str(err.value)


def test_unreadable_files_and_unknown_names(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(InputError, match=f"--model: {bad} is not a readable JSON config.json"):
        get_model(str(bad))
    with pytest.raises(InputError, match="no model preset or config.json"):
        get_model(str(tmp_path / "absent" / "config.json"))
    with pytest.raises(UnknownNameError, match="; or the path of a model's config.json"):
        get_model("llama-4")


def test_the_flag_makes_a_config_path_absolute_and_leaves_presets_as_names(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, LLAMA_31_8B)
    assert model_arg("model/config.json") == str(tmp_path / "model" / "config.json")
    assert model_arg("Llama-3.1-8B") == "Llama-3.1-8B" and model_arg("llama3-8b") == "llama3-8b"
    assert MODEL.type is model_arg
    # a file changed on disk is read again
    path = str(tmp_path / "model" / "config.json")
    assert load_config(path).layers == 32
    stat = os.stat(path)
    _write(tmp_path, dict(LLAMA_31_8B, num_hidden_layers=16))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert load_config(path).layers == 16


@pytest.mark.parametrize("command", [
    ("sim", "--workload", "chat", "--duration", "5", "--capacity-blocks", "2000", "--quiet"),
    ("sweep", "--workload", "chat", "--duration", "5", "--capacity-blocks", "2000", "--quiet", "--out", "unused"),
    ("replica", "--capacity-blocks", "100"),
    ("up", "--port", "0"),
    ("estimate", "--capacity-blocks", "2000"),
])
def test_every_command_taking_a_model_refuses_a_bad_config_in_one_line(tmp_path, capsys, command):
    from kvemu.cli import main

    path = _write(tmp_path, dict(QWEN3_32B, layer_types=["full_attention", "linear_attention"] * 32))
    command = tuple(str(tmp_path / arg) if arg == "unused" else arg for arg in command)  # no file in the cwd
    capsys.readouterr()
    assert main([*command, "--model", path]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --model: {path}: 'layer_types' has linear_attention in a Qwen3ForCausalLM: kvemu knows" \
                  " the state of Qwen3NextForCausalLM's Gated DeltaNet layers only\n"


def test_sim_runs_a_config_json_as_its_preset(tmp_path, capsys):
    from kvemu.cli import main

    path = _write(tmp_path, LLAMA_31_8B, "Llama-3.1-8B.config.json")
    runs = []
    for model in (path, "llama-3.1-8b"):
        out = tmp_path / f"{len(runs)}.json"
        assert main(["sim", "--workload", "chat", "--duration", "30", "--gpu", "rtx-4090", "--gpu-memory-utilization",
                     "0.9", "--model", model, "--quiet", "--json", str(out)]) == 0
        runs.append({k: v for k, v in json.loads(out.read_text())["runs"][0].items() if k != "wall_s"})
    capsys.readouterr()
    assert runs[0] == runs[1] and runs[0]["model"] == "llama-3.1-8b" and runs[0]["served"] > 0
