import json

import pytest

from kvemu.cli import main
from shared.costmodel import CostModel, Efficiency, get_gpu
from shared.devprofile import DeviceProfile, load_profile, save_profile
from shared.errors import InputError, UnknownNameError


def _profile(tmp_path, linear=0.5):
    gpu = get_gpu("h200")
    eff = Efficiency(linear, 0.25, 0.5, 0.5, 0.0, 0.0, "test")
    path = tmp_path / "dev.json"
    save_profile(DeviceProfile(type(gpu)("my-gpu", 100e12, 1e12, 80e9), {"llama-3-8b": eff}, {"device": "test"}), str(path))
    return path


def test_a_profile_replaces_the_gpu_and_the_models_efficiencies(tmp_path):
    path = _profile(tmp_path)
    cm = CostModel.from_names("llama-3-8b", str(path))
    assert cm.gpu.name == "my-gpu" and cm.gpu.peak_flops == 100e12
    assert cm.efficiency.linear == 0.5
    linear, attn = cm.prefill_flops(1024, 0)
    assert cm.prefill_parts(1024, 0).linear == pytest.approx(linear / 50e12)
    # a model the profile has no fit for keeps its preset's efficiencies on the profile's GPU
    other = CostModel.from_names("qwen3-coder-30b-a3b", str(path))
    assert other.efficiency == other.model.efficiency
    assert CostModel.from_names("llama-3-8b", f"{path}@tp2").tp == 2


def test_bad_profiles_are_one_line_errors_naming_the_flag(tmp_path):
    with pytest.raises(InputError, match="--gpu-file: no device profile"):
        load_profile(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"kvemu_profile": 1, "gpu": {"name": "x", "peak_flops": -1, "hbm_bandwidth": 1,
                                                          "memory_bytes": 1}, "models": {}}))
    with pytest.raises(InputError, match="peak_flops"):
        load_profile(str(bad))
    bad.write_text(json.dumps({"gpu": {}}))
    with pytest.raises(InputError, match="not a kvemu device profile"):
        load_profile(str(bad))


def test_sim_prices_time_with_the_profile(tmp_path, capsys):
    fast, slow = _profile(tmp_path, linear=1.0), tmp_path / "slow.json"
    raw = json.loads(fast.read_text())
    raw["models"]["llama-3-8b"]["linear"] = 0.1
    slow.write_text(json.dumps(raw))
    ttft = {}
    for name, path in (("fast", fast), ("slow", slow)):
        out = tmp_path / f"{name}.json"
        assert main(["sim", "--workload", "chat", "--duration", "20", "--capacity-blocks", "2000", "--model", "llama-3-8b",
                     "--gpu-file", str(path), "--json", str(out), "--quiet"]) == 0
        run = json.loads(out.read_text())["runs"][0]
        assert run["gpu"] == "my-gpu"
        ttft[name] = run["ttft_p50_s"]
    assert ttft["slow"] > 2 * ttft["fast"]
    assert main(["sim", "--workload", "chat", "--duration", "5", "--capacity-blocks", "400",
                 "--gpu-file", str(tmp_path / "nope.json")]) == 2
    assert "--gpu-file: no device profile" in capsys.readouterr().err


def test_the_gpu_setting_carries_the_profile_path_and_tp(tmp_path, monkeypatch):
    import argparse

    from kvemu.options.gpu import gpu_setting

    path = _profile(tmp_path)
    monkeypatch.chdir(tmp_path)
    assert gpu_setting(argparse.Namespace(gpu="dev.json", tp=2)) == f"{path}@tp2"  # absolute, for other processes
    assert gpu_setting(argparse.Namespace(gpu="h200", tp=1)) == "h200"
    # what `up` hands a replica comes back unchanged
    assert gpu_setting(argparse.Namespace(gpu=f"{path}@tp2", tp=1)) == f"{path}@tp2"
    with pytest.raises(UnknownNameError, match="unknown gpu 'h300'; valid: a100-80gb"):
        gpu_setting(argparse.Namespace(gpu="h300", tp=1))
