"""A sliding-window model (a tiny gpt-oss-like config.json: window and full layers alternating, so a full and a
window KV cache group) runs in `kvemu sim` and a live `kvemu replica`; what cannot run with its groups is refused in
one line naming the flag."""

import json

import pytest

from kvemu.cli import main
from tests.support.model_config import config_file
from tests.support.procs import http_json, start_replica

OSS = {"architectures": ["GptOssForCausalLM"], "hidden_size": 512, "intermediate_size": 256, "head_dim": 64,
       "num_attention_heads": 16, "num_key_value_heads": 8, "num_hidden_layers": 4, "vocab_size": 1000,
       "num_local_experts": 8, "num_experts_per_tok": 2, "max_position_embeddings": 4096, "sliding_window": 32,
       "layer_types": ["sliding_attention", "full_attention"] * 2}
SIM = ["sim", "--workload", "scm", "--duration", "60", "--capacity-blocks", "400", "--no-reuse-distances", "--quiet"]


@pytest.fixture
def oss(tmp_path):
    return config_file(tmp_path, "oss", OSS)


@pytest.mark.parametrize("mode", [[], ["--cache-only"]])
def test_a_hybrid_model_runs_in_the_simulator(oss, tmp_path, mode):
    out = tmp_path / "runs.json"
    assert main([*SIM, "--model", oss, *mode, "--json", str(out)]) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["requests"] > 0 and 0 < run["block_hit_ratio"] < 1


def test_every_request_a_small_pool_never_admits_is_refused_and_counted(oss, tmp_path):
    # 20 s of scm: 45 requests, 21 over the model's 4,096 tokens. A pool of 150 blocks refuses those whose window
    # group (capped at 1,027 blocks, two steps of 8,192 tokens in flight) and full group together exceed it: every
    # request is run or refused (8 were once neither: refused by the window's tail, never admitted by its cap)
    out = tmp_path / "runs.json"
    assert main([*SIM[:3], "--duration", "20", "--capacity-blocks", "150,5000", *SIM[7:], "--model", oss,
                 "--json", str(out)]) == 0
    runs = [(r["requests"], r["refused"]) for r in json.loads(out.read_text())["runs"]]
    assert runs == [(9, 36), (24, 21)]


def test_estimate_counts_a_window_groups_blocks_as_the_pool_holds_them(oss, capsys):
    # sim/estimate.py's hand-worked case (test_estimate.py): E[B] 4 and A_H 1 blocks held as 6 and 2 (the 32-token
    # window keeps a computed prompt's last 2 blocks), so 0.1 takes 80 blocks, not full attention's 50; a block
    # is one group's page: 2 layers x 8 KV heads x 64 x 2 (K and V) x 2 bytes x 16 tokens = 65,536 bytes
    sets = ["arrival_rate=1", "think_mean=10", "think_dist=deterministic", "turn_dist=fixed", "turns=2",
            "prompt_blocks=1", "response_blocks=2"]
    assert main(["estimate", "--model", oss, *[x for kv in sets for x in ("--set", kv)], "--target-hit-ratio", "0.1",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["capacity_blocks"], doc["block_bytes"], doc["E_B_held"], doc["A_H_held"]) == (80, 65536, 6.0, 2.0)
    assert [g["kind"] for g in doc["kv_groups"]] == ["window", "full"]


@pytest.mark.parametrize("flags, message", [
    (["--scheduler", "reorder"], "--scheduler: oss has sliding-window layers (KV cache groups, cache/grouped.py):"
                                 " reorder's loans count one group's blocks: use --scheduler fcfs"),
    (["--host-cache-gib", "1"], "--host-cache-gib: oss has sliding-window layers (KV cache groups,"
                                " cache/grouped.py): memory tiers below HBM are not modelled per group yet (vLLM"
                                " 0.33's OffloadingConnector offloads each group's blocks)"),
    (["--speculative-method", "eagle", "--num-speculative-tokens", "2", "--acceptance-rate", "0.7"],
     "--speculative-method: oss has sliding-window layers (KV cache groups, cache/grouped.py): an EAGLE or MTP"
     " drafter's prefix hit needs one window block more and drops its last (vLLM's use_eagle), not modelled: use"
     " ngram"),
    (["--prefill-replicas", "1", "--decode-replicas", "1"],
     "--prefill-replicas: oss has sliding-window layers (KV cache groups): P/D's transfer of each group's blocks"
     " is not modelled yet (vLLM 0.33's NixlConnector moves them)"),
])
def test_what_cannot_run_with_windows_is_refused_in_one_line(oss, capsys, flags, message):
    assert main([*SIM, "--model", oss, *flags]) != 0
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_a_live_replica_serves_a_hybrid_model_and_hits_what_every_group_holds(oss):
    proc = start_replica("--model", oss, capacity_blocks=200)
    try:
        body = {"token_ids": list(range(1, 201)), "max_tokens": 4}
        status, first = http_json("POST", proc.url + "/generate", body)
        assert status == 200 and first["cached_tokens"] == 0
        # 199 tokens may hit: 12 blocks; the full group holds all, the window (32 tokens) blocks 10 and 11
        status, again = http_json("POST", proc.url + "/generate", body)
        assert status == 200 and again["cached_tokens"] == 192
    finally:
        assert proc.stop() == 0
