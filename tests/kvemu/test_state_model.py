"""A model with state layers (Qwen3-Next's Gated DeltaNet beside full attention, vLLM's MambaManager in 'align'
mode) runs in `kvemu sim` (the published preset, and a tiny Qwen3-Next-like config.json) and a live `kvemu replica`;
what cannot run with its state groups is refused in one line naming the flag."""

import json

import pytest

from kvemu.cli import main
from tests.support.model_config import config_file
from tests.support.procs import http_json, start_replica

# three Gated DeltaNet layers and one full-attention layer (full_attention_interval 4): three state groups, one full
TINY = {"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "full_attention_interval": 4,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "head_dim": 64, "hidden_size": 256, "intermediate_size": 512,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_value_head_dim": 16, "max_position_embeddings": 4096, "moe_intermediate_size": 128,
        "num_attention_heads": 4, "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 4,
        "num_key_value_heads": 2, "shared_expert_intermediate_size": 128, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "vocab_size": 1000}
SIM = ["sim", "--workload", "scm", "--duration", "60", "--capacity-blocks", "400", "--no-reuse-distances", "--quiet"]


@pytest.fixture
def qwen(tmp_path):
    return config_file(tmp_path, "qwen3-next-tiny", TINY)


def test_the_qwen3_next_preset_runs_the_chat_workload_in_the_simulator(tmp_path):
    out = tmp_path / "runs.json"
    assert main(["sim", "--model", "qwen3-next-80b-a3b", "--gpu", "h200", "--tp", "2", "--workload", "chat",
                 "--duration", "60", "--quiet", "--json", str(out)]) == 0
    run = json.loads(out.read_text())["runs"][0]
    # a next turn finds the state its turn before kept at a 544-token block's end, not every block of its prompt
    assert run["requests"] > 0 and 0.5 < run["block_hit_ratio"] < 1
    # the pool runs in the blocks the memory rule sized: 7,790 of 544 tokens (the workload cut into them), not 16
    assert (run["block_size"], run["capacity_blocks"], run["capacity_tokens"]) == (544, 7790, 7790 * 544)
    assert run["memory_rule"]["block_size"] == 544


def test_a_trace_of_hashes_cut_for_other_blocks_is_refused_naming_the_model(capsys):
    assert main(["sim", "--model", "qwen3-next-80b-a3b", "--gpu", "h200", "--tp", "2", "--trace",
                 "mooncake-conversation", "--quiet"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "error: --model: qwen3-next-80b-a3b is served in blocks of 544 tokens (vLLM raises the block for its state"
        " layers to hold a state), and this trace's hash ids stand for blocks of another size")


@pytest.mark.parametrize("mode", [[], ["--cache-only"]])
def test_a_state_model_runs_in_the_simulator(qwen, tmp_path, mode):
    out = tmp_path / "runs.json"
    assert main([*SIM, "--model", qwen, *mode, "--json", str(out)]) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["requests"] > 0 and 0 < run["block_hit_ratio"] < 1


@pytest.mark.parametrize("argv, message", [
    ([*SIM, "--speculative-method", "ngram", "--num-speculative-tokens", "2", "--acceptance-rate", "0.7"],
     "--speculative-method: qwen3-next-tiny has state layers (KV cache groups, cache/grouped.py): speculative"
     " decoding's state blocks (vLLM's num_speculative_blocks) are not modelled: drop it"),
    ([*SIM, "--prefill-replicas", "1", "--decode-replicas", "1"],
     "--prefill-replicas: qwen3-next-tiny has state layers (KV cache groups): P/D's transfer of each group's"
     " blocks is not modelled yet"),
    (["estimate", "--capacity-blocks", "100"],
     "--model: qwen3-next-tiny has state layers (KV cache groups): the mean-field estimate counts full-attention"
     " and sliding-window blocks only; run kvemu sim --model for its hit ratio"),
])
def test_what_cannot_run_with_state_groups_is_refused_in_one_line(qwen, capsys, argv, message):
    assert main([*argv, "--model", qwen]) != 0
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_a_live_replica_serves_a_state_model_and_hits_the_states_its_chunks_kept(qwen):
    proc = start_replica("--model", qwen, capacity_blocks=200)
    try:
        _, stats = http_json("GET", proc.url + "/stats")
        bs = stats["block_size"]
        assert stats["kv_groups"]["count"] == 4
        first = [1 + i % 900 for i in range(5 * bs + 5)]  # one chunk to 5 blocks, its last boundary: one state kept
        other = [*first[:4 * bs], *range(901, 921)]  # the same 4 blocks, then its own
        third = [*first[:4 * bs], *range(921, 941)]  # the same 4 blocks, then another
        hits = []
        for tokens in (first, other, third):
            status, body = http_json("POST", proc.url + "/generate", {"token_ids": tokens, "max_tokens": 2})
            assert status == 200
            hits.append(body["cached_tokens"])
        # the full group holds the shared 4 blocks, but no state was kept there: no hit; the second request's first
        # chunk stops at that junction (vLLM's shared_prefix_boundary), so the third finds the state there
        assert hits == [0, 0, 4 * bs]
    finally:
        assert proc.stop() == 0
