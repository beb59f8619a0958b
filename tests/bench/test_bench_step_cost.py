"""bench/bench_step_cost.py --decode-sweep on the CPU (the smoke check of the GPU sweep): it writes
the calibration file's format, every layer with its own K/V, and prices each point by the model."""

import json

import pytest


def test_the_decode_sweep_writes_the_calibration_format_on_the_cpu(load_bench, tmp_path, capsys):
    pytest.importorskip("torch")
    bench = load_bench("bench_step_cost")
    out = tmp_path / "sweep.json"
    assert bench.main(["--device", "cpu", "--decode-sweep", "--batches", "1,2", "--contexts", "8,32",
                       "--out", str(out)]) == 0
    raw = json.loads(out.read_text())
    assert raw == json.loads(capsys.readouterr().out)
    assert raw["model"] == "tiny" and raw["layers"] == 4
    assert [(p["batch"], p["context"]) for p in raw["decode"]] == [(1, 8), (1, 32), (2, 8), (2, 32)]
    assert [p["batch"] for p in raw["projections"]] == [1, 2] == [p["batch"] for p in raw["lm_head"]]
    for p in raw["decode"] + raw["projections"] + raw["lm_head"]:
        assert p["seconds"] > 0
    for p in raw["preset_vs_decode"]:
        assert p["error"] == pytest.approx(p["model_s"] / p["seconds"] - 1, abs=1e-3)  # each rounded
    # bench_costmodel_fit sets every decode form beside the sweep's points
    load_bench("bench_costmodel_fit").main(["--decode", str(out)])
    decode = json.loads(capsys.readouterr().out)["decode"]
    assert decode["measured"] and [p["seconds"] for p in decode["points"]] == [p["seconds"] for p in raw["decode"]]
    for p in decode["points"]:
        assert set(p) >= {"before_last_round_error", "last_round_error", "preset_error"}
        assert p["preset_s"] > p["last_round_s"]  # the graph replay's fixed cost


def test_each_layer_of_the_sweep_has_its_own_kv(load_bench):
    torch = pytest.importorskip("torch")
    sweep = load_bench("decode_sweep")
    from replica.backends.calibration import Calibrator
    from shared.costmodel import get_model

    bench = Calibrator(get_model("tiny"), "cpu", 4)
    past_k, past_v = sweep._past(bench, 3, 10)
    assert len(past_k) == len(past_v) == 4
    assert past_k[0].shape == (3, 2, 11, 32)  # batch, KV heads, context + the new token, head dim
    assert len({t.data_ptr() for t in past_k + past_v}) == 8  # no two layers share a tensor
    assert not torch.equal(past_k[0], past_k[1])
