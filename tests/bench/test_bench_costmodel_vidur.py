"""bench/bench_costmodel_vidur.py: Vidur's vendored operator times summed as Vidur's predictor sums
a layer, and kvemu's price of the same work (layers only, no attention), worked by hand."""

import csv

import pytest


def test_one_token_through_llama_3_8b_on_an_a100_by_hand(load_bench):
    vidur = load_bench("bench_costmodel_vidur")
    with vidur.DATA.open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 52 and {(r["gpu"], r["kvemu_model"]) for r in rows} == {
        ("a100", "llama-3-8b"), ("a100", "llama-3-70b"), ("a100", "llama-2-70b"), ("h100", "llama-2-70b")}
    (row,) = [r for r in rows if r["gpu"] == "a100" and r["kvemu_model"] == "llama-3-8b" and r["num_tokens"] == "1"]
    # Vidur's medians, us: norms 5 + 5, QKV 33, rotary 4, output 25, gate-up 142, SiLU 11, down 76, add 2
    assert vidur.vidur_forward(row, 32) == pytest.approx(32 * 303e-6)
    cost = vidur.variants("llama-3-8b", "a100-80gb")
    # the 32 layers' weights (no LM head) at 0.80 x 2.039 TB/s, and 11 graph nodes at 0.5 us a layer
    weights = 32 * 218_103_808 * 2 / (0.8 * 2.039e12)
    assert vidur.kvemu_forward(cost["preset"], 1) == pytest.approx(weights + 32 * 5.5e-6)
    assert vidur.kvemu_forward(cost["no_graph_fixed_cost"], 1) == pytest.approx(weights)
    # 1,024 tokens: an eager prefill chunk, compute-bound, no attention priced
    m = cost["preset"].model
    assert vidur.kvemu_forward(cost["preset"], 1024) == pytest.approx(
        2 * 1024 * 32 * m.layer_params() / (312e12 * 0.6432) + 32 * 5.09e-5)
