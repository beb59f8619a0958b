"""bench/bench_e2e.py: the shipped RTX 4090 run of vLLM predicted from the GPU's datasheet and from its
operator profile, each with vLLM's reported KV blocks and with kvemu's memory rule."""

import json

import pytest


@pytest.fixture
def e2e(load_bench):
    return load_bench("bench_e2e")


def test_the_engine_is_the_runs_own(e2e):
    engine = e2e.engine_of(e2e.RUN / "meta.json")
    assert engine == e2e.Engine(max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=32768, block_size=16,
                                gpu_memory_utilization=0.9, prefix_caching=True, num_gpu_blocks=2588,
                                vllm_version="0.19.0")
    assert engine.sim_flags() == ["--max-running", "256", "--token-budget", "2048", "--max-model-len", "32768",
                                  "--block-size", "16", "--prefix-caching", "on", "--hit-mode", "prefix",
                                  "--policy", "lru"]
    e2e.check_workload(e2e.RUN / "meta.json", e2e.WORKLOAD)  # the shipped .gz is the run's workload, byte for byte


def test_llmservingsims_own_errors_are_read_from_its_summary(e2e):
    errors = e2e.llmservingsim_errors(e2e.RUN / "llmservingsim-summary.txt")
    assert len(errors) == 15  # TTFT, TPOT, latency x mean, median, P90, P95, P99
    assert errors["ttft_mean"] == pytest.approx(0.006) and errors["tpot_mean"] == pytest.approx(0.002)
    assert errors["e2e_mean"] == pytest.approx(0.005) and errors["tpot_p99"] == pytest.approx(0.009)


def test_the_shipped_run_predicted_four_ways(e2e, capsys):
    assert e2e.main(["--runs", "rtx4090", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert sorted(out["configurations"]) == ["rtx4090/datasheet/memory_rule", "rtx4090/datasheet/vllm_blocks",
                                             "rtx4090/profile/memory_rule", "rtx4090/profile/vllm_blocks"]
    blocks = {k: v["kv_blocks"] for k, v in out["configurations"].items()}
    # vLLM's rule (shared/memory_rule.py; tests/shared/test_memory_rule.py works it by hand): 2,587 blocks of
    # 2 MiB, where vLLM had 2,588
    assert blocks == {"rtx4090/datasheet/vllm_blocks": 2588, "rtx4090/datasheet/memory_rule": 2587,
                      "rtx4090/profile/vllm_blocks": 2588, "rtx4090/profile/memory_rule": 2587}
    figures = out["figures"]["rtx4090"]
    # the measured side is the run's requests.jsonl as LLMServingSim's summary reads it (its vLLM column, ms)
    assert figures["ttft_mean_s"]["measured"] == pytest.approx(65.4566, abs=1e-4)
    assert figures["tpot_mean_s"]["measured"] == pytest.approx(0.0324, abs=1e-4)
    assert figures["e2e_mean_s"]["measured"] == pytest.approx(86.5783, abs=1e-4)
    assert set(figures["e2e_p99_s"]) == {"measured", "datasheet/vllm_blocks", "datasheet/memory_rule",
                                         "profile/vllm_blocks", "profile/memory_rule"}
    # the bar, from the operator profile with vLLM's count
    done = out["done_when"]
    assert done["configuration"] == "rtx4090/profile/vllm_blocks" and done["all_met"], done
    sim = out["configurations"]["rtx4090/datasheet/vllm_blocks"]["commands"][0]
    assert sim.startswith("kvemu sim --trace bench/data/llmservingsim/workloads/sharegpt-llama-3.1-8b-300-sps10"
                          ".jsonl.gz --model llama-3.1-8b --gpu rtx-4090 --capacity-blocks 2588 --max-running 256")
    assert out["calibration"]["command"].startswith(
        "kvemu calibrate --from-profile bench/data/llmservingsim/perf/RTX4090/meta-llama/Llama-3.1-8B/bf16")


def test_an_unknown_run_is_one_line(e2e, capsys):
    with pytest.raises(SystemExit) as exc:
        e2e.main(["--runs", "h100"])
    assert exc.value.code == 2
    assert "--runs: give rtx4090, distserve or both, got 'h100'" in capsys.readouterr().err
