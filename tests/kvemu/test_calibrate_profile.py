"""`kvemu calibrate --from-profile`: a device profile fitted to a published operator profile."""

import json
import shutil
from pathlib import Path

import pytest

from kvemu.calibrate_profile import parse_weights
from kvemu.cli import main
from shared.costmodel import CostModel, StepWork

DATA = Path(__file__).resolve().parents[2] / "bench" / "data"
LSS = DATA / "llmservingsim"
LSS_FOLDER = LSS / "perf" / "RTX4090" / "meta-llama" / "Llama-3.1-8B" / "bf16"


def test_the_shipped_profile_fits_within_bounds_by_kind(tmp_path, capsys):
    out = tmp_path / "rtx4090.json"
    # the GPU and the model by default: the profile's own (NVIDIA GeForce RTX 4090, meta-llama/Llama-3.1-8B)
    assert main(["calibrate", "--from-profile", str(LSS), "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in printed.splitlines() if line.split()[:1] in
            (["prefill"], ["decode"], ["mixed"], ["skew"])}
    # points per kind: every prefill of the grid; decode and mixed steps as many as fit kvemu's KV capacity
    # for this GPU and model (at least the 71 decode steps within vLLM's own 2,588 blocks)
    assert rows["prefill"][1] == "96" and int(rows["decode"][1]) >= 71 and int(rows["mixed"][1]) > 5000
    profile = json.loads(out.read_text())
    errs = profile["fit_errors"]["llama-3.1-8b"]
    # in-sample, by kind (a fit measured at 8.8% / 1.4% / 8.2%): decode steps, three quarters of the
    # weight, are priced closest; the form has no term for a mixed batch's long-context decoders
    assert errs["decode"]["mean_abs"] <= 0.03 and errs["decode"]["max_abs"] <= 0.10
    assert errs["mixed"]["mean_abs"] <= 0.10 and errs["prefill"]["mean_abs"] <= 0.12
    assert errs["skew_attention"]["points"] == int(rows["skew"][1]) > 0
    assert profile["gpu"]["name"] == "rtx-4090" and profile["device"] == "NVIDIA GeForce RTX 4090"
    eff = profile["models"]["llama-3.1-8b"]
    assert eff["graph_tokens"] == 0 and eff["decode_overhead_s"] == 0.0  # kernel times: no graph's costs in them
    # loaded as --gpu-file is: the decode step of one sequence over 16 KV tokens (16.642 ms in the profile)
    cost = CostModel.from_names("llama-3.1-8b", str(out))
    assert cost.step_time(StepWork(decoders=1, decode_kv=16)) / 0.01664246327 - 1 == pytest.approx(0, abs=0.05)


def test_vidur_profiles_fit_the_layers_they_hold(tmp_path, capsys):
    out = tmp_path / "a100.json"
    assert main(["calibrate", "--from-profile", str(DATA / "vidur"), "--gpu", "a100", "--model", "llama-3-8b",
                 "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "mixed" not in printed.split("{")[0]  # no attention in Vidur's files: no mixed step
    errs = json.loads(out.read_text())["fit_errors"]["llama-3-8b"]
    assert (errs["prefill"]["points"], errs["decode"]["points"]) == (4, 9)  # 512..4096 tokens; 1..256
    assert errs["prefill"]["max_abs"] <= 0.08 and errs["decode"]["max_abs"] <= 0.08


def _refused(capsys, *args: str) -> str:
    assert main(["calibrate", *args]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0]
    return lines[0]


def _copy(tmp_path: Path, leave_out: str = "") -> Path:
    folder = tmp_path / "bf16"
    shutil.copytree(LSS_FOLDER, folder, ignore=shutil.ignore_patterns("skew*.csv", leave_out or "-"))
    return folder


@pytest.mark.parametrize("missing", ["per_sequence.csv", "attention.csv", "dense.csv"])
def test_a_folder_missing_a_file_is_refused_naming_it(tmp_path, capsys, missing):
    folder = _copy(tmp_path, missing)
    line = _refused(capsys, "--from-profile", str(folder), "-o", str(tmp_path / "p.json"))
    assert line == f"error: --from-profile: {folder / 'tp1' / missing}: missing"
    assert not (tmp_path / "p.json").exists()


def test_no_profile_for_the_tp_or_no_meta_is_refused_naming_the_file(tmp_path, capsys):
    folder = _copy(tmp_path)
    assert _refused(capsys, "--from-profile", str(folder), "--tp", "2") == (
        f"error: --from-profile: {folder / 'tp2' / 'dense.csv'}: missing: no profile for --tp 2 (this one has tp1)")
    assert _refused(capsys, "--from-profile", str(tmp_path / "bf16" / "tp1")) == (
        f"error: --from-profile: {folder / 'tp1' / 'meta.yaml'}: missing (no LLMServingSim profile below "
        f"{folder / 'tp1'})")
    assert _refused(capsys, "--from-profile", str(DATA / "vidur"), "--gpu", "a100", "--model", "llama-3-8b",
                    "--tp", "2").startswith(f"error: --from-profile: {DATA / 'vidur' / 'mlp_ops.csv'}: no row for "
                                            "llama-3-8b on a100-80gb at tp 2 (it has: ")


def test_a_bad_row_or_another_model_is_refused_naming_the_file(tmp_path, capsys):
    folder = _copy(tmp_path)
    dense = folder / "tp1" / "dense.csv"
    good = dense.read_text()
    dense.write_text(good.replace("act_fn,2,3.18967", "act_fn,2,fast"))
    assert _refused(capsys, "--from-profile", str(folder)) == f"error: --from-profile: {dense}:3: 'fast' is not a number"
    dense.write_text(good)
    line = _refused(capsys, "--from-profile", str(LSS), "--model", "qwen3-8b")
    assert line.startswith(f"error: --from-profile: {LSS_FOLDER / 'meta.yaml'}: the profiled model (meta-llama/")
    assert line.endswith("is not --model qwen3-8b's shape")
    meta = folder / "meta.yaml"
    meta.write_text(meta.read_text().replace("RTX4090", "X1").replace("NVIDIA GeForce RTX 4090", "Mystery X1"))
    assert _refused(capsys, "--from-profile", str(folder)) == (
        "error: --gpu: no preset is named like the profile's device (X1 / Mystery X1): name the card it was measured "
        "on, a preset or a device profile file with its datasheet rates")
    assert _refused(capsys, "--gpu", "h100", "--device", "cpu") == (
        "error: --gpu: only with --from-profile: without it calibrate measures this device's own rates")


def test_kind_weights_are_shares():
    assert parse_weights("prefill=1,decode=2,mixed=1") == {"prefill": 0.25, "decode": 0.5, "mixed": 0.25}
    assert parse_weights("decode=3") == {"prefill": 0.0, "decode": 1.0, "mixed": 0.0}
    with pytest.raises(Exception, match="KIND=W"):
        parse_weights("decoding=1")
