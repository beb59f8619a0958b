"""bench/bench_models.py: the KV a request holds worked by hand (MLA's 70,272 bytes a token on any --tp, FP8's half,
gpt-oss-120b's window group), --tiny's FP8 pair of `kvemu sim` points, the speculative summary and the capacity rule by
hand, and --from on a saved document."""

from __future__ import annotations

import json

from bench import bench_models as bm


def test_kv_a_request_holds_by_hand():
    ds = bm.kv_row("deepseek-v3")
    # (512 + 64) latent values x 61 layers x 2 bytes, whole on every rank (one latent "head" cannot be split)
    assert ds["bytes_a_token"] == 70_272 and ds["bytes_a_token_per_gpu"] == {1: 70_272, 8: 70_272}
    assert ds["requests"][8192] == {"blocks": 512, "blocks_by_group": [512], "bytes": 512 * 16 * 70_272,
                                    "full_attention_bytes": 512 * 16 * 70_272}
    fp8 = bm.kv_row("deepseek-v3@kv=fp8")
    assert fp8["bytes_a_token"] == 35_136 and fp8["requests"][65536]["bytes"] == 4096 * 16 * 35_136
    oss = bm.kv_row("gpt-oss-120b")
    # 18 window layers of 128 tokens, then 18 full: two groups of 18 layers, a block 18 x 16 x (2 x 8 x 64 x 2) bytes
    assert [(g["kind"], g["layers"]) for g in oss["groups"]] == [("window", 18), ("full", 18)]
    assert oss["block_bytes"] == 18 * 16 * 2048
    # at 64K tokens the window still reads (65,536 - 128 + 1) // 16 = 4,088 blocks fewer than the 4,096 it spans
    assert oss["requests"][65536]["blocks_by_group"] == [8, 4096]
    assert oss["requests"][65536]["full_attention_bytes"] == 65536 * 36 * 2048
    # a window of 128 over 200 tokens in blocks of 16: 13 blocks spanned, (200 - 128 + 1) // 16 = 4 passed
    assert bm.skipped_blocks(128, 200, 16) == 4
    assert bm.kv_row("llama-3-8b")["requests"][65536] is None  # past its 8,192-token window
    nxt = bm.kv_row("qwen3-next-80b-a3b")
    # three state groups hold the latest state's page each, the full group every block of the raised block size
    bs, kinds = nxt["block_size"], [g["kind"] for g in nxt["groups"]]
    assert kinds == ["state"] * 3 + ["full"] and bs % 16 == 0 and bs > 16
    assert nxt["requests"][8192]["blocks_by_group"] == [1, 1, 1, -(-8192 // bs)]


def test_the_tiny_mode_end_to_end(tmp_path):
    """--tiny's FP8 pair through main: the process pool, the document, its commands."""
    out = tmp_path / "doc.json"
    assert bm.main(["--tiny", "--sections", "fp8", "--jobs", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    runs = doc["runs"]
    assert [(r["model"], r["kv"]) for r in runs] == [("deepseek-v3", "auto"), ("deepseek-v3", "fp8")]
    assert runs[1]["command"].startswith("kvemu sim --workload agent --duration 30 --set session_rate=0.1")
    assert "--kv-cache-dtype fp8" in runs[1]["command"] and "error" not in runs[0]
    bf16, fp8 = (r["memory_rule_blocks"] for r in runs)
    # the same KV bytes a GPU over pages of half the bytes: twice the blocks, one more where the rest holds one
    assert fp8 in (2 * bf16, 2 * bf16 + 1) and runs[0]["kv_gib_per_gpu"] == runs[1]["kv_gib_per_gpu"]
    assert runs[0]["served"] == runs[1]["served"] > 0 and runs[0]["tokens_a_verification"] == 1.0
    assert doc["kv"] == [] and doc["spec"] == [] and doc["window_missing"] is None


def _spec(k, p, tpot, tokens=1.0):
    return {"study": "spec", "rate": 0.1, "k": k, "p": p, "tpot_p50_s": tpot, "tokens_a_verification": tokens}


def test_spec_summary_and_window_capacity_by_hand():
    runs = [_spec(0, None, 0.010), _spec(1, 0.7, 0.008, 1.7), _spec(2, 0.7, 0.006, 2.22), _spec(3, 0.7, 0.0066, 2.58)]
    (s,) = bm.spec_summary(runs)
    assert s["best_k"] == 2 and abs(s["speedup_at_best"] - 10 / 6) < 1e-12
    # each K against K - 1: 20 %, 25 %, then -10 %: the third draft token stopped paying
    assert [round(s["gain_by_k"][k], 6) for k in (1, 2, 3)] == [0.2, 0.25, -0.1]
    assert s["tokens_by_k"] == {0: 1.0, 1: 1.7, 2: 2.22, 3: 2.58}
    kv = {"gpt-oss-120b": {"requests": {8192: {"blocks": 518}, 65536: {"blocks": 4104}}},
          "twin": {"requests": {8192: {"blocks": 512}, 65536: {"blocks": 4096}}}}
    win = [{"study": "window", "variant": "hybrid", "memory_rule_blocks": 16_248},
           {"study": "window", "variant": "full twin", "memory_rule_blocks": 8_124}]
    # 16,248 // 518 = 31, // 4,104 = 3; 8,124 // 512 = 15, // 4,096 = 1
    assert [c["requests_fit"] for c in bm.window_capacity(win, kv)] == [{8192: 31, 65536: 3}, {8192: 15, 65536: 1}]


def test_from_a_saved_document(tmp_path, capsys):
    doc = {"kv": [], "runs": [{"study": "fp8", "model": "m", "gpu": "h100", "tp": 1, "rate": 0.02, "kv": "fp8",
                               "memory_rule_blocks": 17_806, "token_hit_ratio": 0.97671, "ttft_p50_s": 0.0537,
                               "ttft_p99_s": 0.8791, "tpot_p50_s": 0.0058, "preemptions": 0}], "spec": []}
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(doc))
    assert bm.main(["--from", str(path)]) == 0
    assert "| m, 1x h100 | 0.02 | fp8 | 17,806 | 0.9767 | 53.7 / 879.1 | 5.8 | 0 |" in capsys.readouterr().out
