"""`kvemu sim` from the command line: labelled units, --csv, the unbounded-queue warning, and
--plot refused before any work when matplotlib is missing."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvemu.cli import main
from replica.core.compiled import pool as compiled_pool
from shared.plotting import MISSING

REPO = Path(__file__).resolve().parents[2]
SIM = ["sim", "--workload", "scm", "--duration", "600", "--policy", "lru,s3fifo", "--capacity-blocks", "2000,8000",
       "--no-reuse-distances", "--quiet", "--max-model-len", "32000"]  # what the smaller pool holds: no warning


def test_table_labels_ttft_in_ms_and_csv_matches_json(tmp_path, capsys):
    out_json, out_csv = tmp_path / "runs.json", tmp_path / "runs.csv"
    assert main([*SIM, "--json", str(out_json), "--csv", str(out_csv)]) == 0
    captured = capsys.readouterr()
    table = captured.out.splitlines()
    assert table[0].split() == ["policy", "capacity", "R", "blk_hit", "tok_hit", "CSR", "holes/req", "ttft_p50_ms",
                                "ttft_p99_ms", "imbal", "refused"]
    runs = json.loads(out_json.read_text())["runs"]
    for line, run in zip(table[1:], runs):
        cells = line.split()
        assert cells[7] == f"{run['ttft_p50_s'] * 1000:,.1f}" and cells[8] == f"{run['ttft_p99_s'] * 1000:,.1f}"
    with open(out_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["policy"], int(r["capacity_blocks"])) for r in rows] == [(r["policy"], r["capacity_blocks"])
                                                                       for r in runs]
    for row, run in zip(rows, runs):
        assert row["trace"] == "scm"
        assert float(row["block_hit_ratio"]) == run["block_hit_ratio"]
        assert float(row["ttft_p99_s"]) == run["ttft_p99_s"] and row["max_running"] == "256"
        assert row["saturated"] == "False"
    assert "warning" not in captured.err  # one replica keeps up with this load
    assert captured.err == f"csv: 4 rows written to {out_csv}\n"


def test_an_unbounded_queue_is_called_out(capsys):
    """The tour's cache-simulator setting (docs/tour.md): one request at a time falls behind the trace."""
    assert main(["sim", "--trace", "mooncake-conversation", "--capacity-blocks", "4000", "--max-running", "1",
                 "--no-reuse-distances", "--hit-mode", "holes", "--quiet"]) == 0  # the figure's hit mode (holes)
    err = capsys.readouterr().err
    assert err == ("warning: lru @ 4,000 blocks: the replica queue grew without bound (the last request finished"
                   " 3.6 h after the last arrival, over a 58.9 min trace), so TTFT is mostly queueing; raise"
                   " --max-running (now 1) or --replicas (now 1), or lower the load\n")


def test_plot_without_matplotlib_fails_before_running(tmp_path):
    shim = tmp_path / "shim" / "matplotlib"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('matplotlib is not installed here')\n")
    env = {**os.environ, "PYTHONPATH": f"{shim.parent}{os.pathsep}{REPO}"}
    for cmd in ([*SIM, "--csv", str(tmp_path / "x.csv")],
                ["replay", "--url", "http://127.0.0.1:9", "--workload", "chat", "--csv", str(tmp_path / "x.csv")],
                ["demo"]):
        proc = subprocess.run([sys.executable, "-m", "kvemu", *cmd, "--plot", str(tmp_path / "x.png")], cwd=REPO,
                              env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (cmd, proc.stderr)
        assert proc.stdout == "" and proc.stderr == f"error: {MISSING}\n", (cmd, proc.stderr)
    assert os.listdir(tmp_path) == ["shim"]


def test_many_saturated_runs_make_one_warning(capsys):
    assert main(["sim", "--trace", "mooncake-conversation", "--policy", "lru,s3fifo", "--capacity-blocks",
                 "4000,18279", "--max-running", "1", "--no-reuse-distances", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: 4 of 4 runs (worst: lru @ 4,000 blocks): the replica")


def test_scheduler_flag_reaches_the_runs(tmp_path, capsys):
    out_json = tmp_path / "runs.json"
    args = ["sim", "--workload", "scm", "--duration", "120", "--capacity-blocks", "2000", "--no-reuse-distances",
            "--quiet", "--jobs", "1", "--json", str(out_json)]
    assert main([*args, "--scheduler", "reorder"]) == 0
    run = json.loads(out_json.read_text())["runs"][0]
    assert run["scheduler"] == "reorder" and run["preemptions"] >= 0 and run["decode_kv"] is True
    assert 0 < run["hbm_utilization"] <= 1 and run["throughput_rps"] > 0
    capsys.readouterr()
    assert main([*args, "--scheduler", "lifo"]) == 2
    assert capsys.readouterr().err == "error: --scheduler: must be one of fcfs, reorder, got 'lifo'\n"


def test_no_decode_kv_gives_the_cache_only_hit_ratios_one_at_a_time(tmp_path, capsys):
    out = tmp_path / "runs.json"
    base = ["sim", "--trace", "mooncake-synthetic", "--capacity-blocks", "2000", "--no-reuse-distances", "--quiet",
            "--json", str(out)]
    ratios = {}
    for extra in (["--cache-only"], ["--max-running", "1", "--no-decode-kv"], ["--max-running", "1"]):
        assert main([*base, *extra]) == 0
        run = json.loads(out.read_text())["runs"][0]
        ratios[extra[-1]] = (run["block_hit_ratio"], run["decode_kv"])
    assert ratios["--no-decode-kv"] == (ratios["--cache-only"][0], False) and ratios["--cache-only"][1] is None
    assert ratios["1"][0] < ratios["--cache-only"][0] and ratios["1"][1] is True  # decode KV evicts a few blocks


def test_json_to_stdout_is_the_only_thing_on_stdout(capsys):
    # `kvemu sim ... --json - | jq` must parse: the table goes to stderr then
    assert main([*SIM, "--json", "-"]) == 0
    captured = capsys.readouterr()
    runs = json.loads(captured.out)["runs"]
    # kept response KV (the default) and dropped alike: the compiled pool, where it is built
    assert {r["engine"] for r in runs} == {"compiled" if compiled_pool.compiled() else "python"}
    assert main([*SIM, "--response-kv", "drop", "--json", "-"]) == 0
    captured = capsys.readouterr()
    runs = json.loads(captured.out)["runs"]
    assert {r["engine"] for r in runs} == {"compiled" if compiled_pool.compiled() else "python"}
    assert captured.err.splitlines()[0].split()[:2] == ["policy", "capacity"]


def _one_request_per_session(path: Path, prompts: list[int]) -> None:
    lines = [json.dumps({"kvemu_trace": 1, "block_size": 16})]
    for i, tokens in enumerate(prompts):
        lines.append(json.dumps({"t": 0.0, "session": f"s{i}", "turn": 0, "input_tokens": tokens, "output_tokens": 1,
                                 "hash_ids": [i * 10_000 + j for j in range(tokens // 16)]}))
    path.write_text("\n".join(lines) + "\n")


def test_sixteen_simultaneous_short_prompts_cost_one_forward(tmp_path, capsys):
    """16 prompts of 64 tokens arriving together are one step of 1,024 tokens: at most 1.3x the
    TTFT of one 1,024-token prompt (it was 3.4x when each chunk was priced as its own forward)."""
    ttft = {}
    for name, prompts in (("burst", [64] * 16), ("one", [1024])):
        _one_request_per_session(tmp_path / f"{name}.jsonl", prompts)
        assert main(["sim", "--trace", str(tmp_path / f"{name}.jsonl"), "--model", "llama-3-8b", "--gpu", "h200",
                     "--capacity-blocks", "4000", "--json", "-", "--quiet"]) == 0
        run = json.loads(capsys.readouterr().out)["runs"][0]
        ttft[name] = run["ttft_p99_s"]
        assert run["ttft_p50_s"] == run["ttft_p99_s"]  # every request of the burst in the same step
    assert ttft["burst"] <= 1.3 * ttft["one"]
    assert ttft["burst"] == pytest.approx(0.02418, rel=1e-3) and ttft["one"] == pytest.approx(0.02491, rel=1e-3)


def test_requests_over_max_model_len_are_refused_and_counted_in_the_json_table_and_csv(tmp_path, capsys):
    from loadgen.formats import write_kvemu
    from loadgen.workloads import generate

    trace = generate("scm", 300, seed=3, overrides={"arrival_rate": "0.5"})
    path = tmp_path / "scm.jsonl"
    write_kvemu(trace, path)
    over = sum(r.input_tokens + max(r.output_tokens, 1) > 8192 for r in trace.requests)
    assert 0 < over < len(trace.requests)
    out_json, out_csv = tmp_path / "r.json", tmp_path / "r.csv"
    argv = ["sim", "--trace", str(path), "--model", "llama-3-8b", "--capacity-blocks", "400,4000", "--quiet",
            "--json", str(out_json), "--csv", str(out_csv), "--jobs", "1"]
    assert main(argv) == 0  # no abort: the run goes on
    captured = capsys.readouterr()
    # 400 blocks hold 6,400 tokens, short of llama-3-8b's 8,192: one line, then 6,400 is that pool's limit
    assert captured.err.splitlines()[0] == (
        "warning: the model's context window (8,192 tokens) needs 512 KV blocks of 16 tokens but the pool holds 400"
        " (6,400 tokens), where vLLM would refuse to start: give a larger capacity (--capacity-gib / --capacity-tokens"
        " / --capacity-blocks"
        " / --gpu-memory-utilization) or --max-model-len 6,400 or less; going on with 6,400 tokens as the limit")
    small = sum(r.input_tokens + max(r.output_tokens, 1) > 6400 for r in trace.requests)
    runs = json.loads(out_json.read_text())["runs"]
    assert [(r["max_model_len"], r["refused"]) for r in runs] == [(6400, small), (8192, over)]
    assert all(r["served"] + r["refused"] == len(trace.requests) for r in runs)
    table = captured.out.splitlines()
    assert table[0].split()[-1] == "refused" and [line.split()[-1] for line in table[1:3]] == [f"{small:,}", f"{over:,}"]
    with open(out_csv, newline="") as fh:
        assert [int(row["refused"]) for row in csv.DictReader(fh)] == [small, over]
    # --max-model-len asks for a limit of its own
    assert main([*argv[:-6], "--max-model-len", "2000", "--json", str(out_json)]) == 0
    capsys.readouterr()
    runs = json.loads(out_json.read_text())["runs"]
    assert {r["refused"] for r in runs} == {sum(r.input_tokens + max(r.output_tokens, 1) > 2000 for r in trace.requests)}


def test_the_length_warning_counts_the_blocks_of_the_size_the_model_is_served_at(capsys):
    """Qwen3-Next's state layers raise its blocks to 544 tokens at --tp 2: 262,144 tokens need 482 of them, which
    the 7,790 blocks of an H200 pair hold (no warning), and 400 do not (217,600 tokens)."""
    argv = ["sim", "--workload", "chat", "--duration", "20", "--model", "qwen3-next-80b-a3b", "--gpu", "h200@tp2",
            "--quiet", "--jobs", "1"]
    main(argv)  # the run itself may be refused (state groups in the scheduler): only the warning is checked here
    err = capsys.readouterr().err
    assert "7,790 blocks of 544 tokens" in err.splitlines()[0] and "warning: the model's context window" not in err
    main([*argv, "--capacity-blocks", "400"])
    assert capsys.readouterr().err.splitlines()[0].startswith(
        "warning: the model's context window (262,144 tokens) needs 482 KV blocks of 544 tokens but the pool holds 400"
        " (217,600 tokens)")


def test_gpu_memory_utilization_is_printed_and_a_model_that_does_not_fit_is_one_line(capsys):
    base = ["sim", "--workload", "scm", "--duration", "60", "--quiet", "--model", "llama-3-70b", "--gpu", "a100-80gb"]
    assert main([*base, "--tp", "2", "--gpu-memory-utilization", "0.9"]) == 0
    out = capsys.readouterr()
    assert out.err.splitlines()[0].startswith("capacity (llama-3-70b): ceil(0.9 x 79.54 GiB of a100-80gb) - 65.71 GiB weights")
    assert out.out.splitlines()[1].split()[1] == "1,154"  # shared/memory_rule.py: non-torch 2.07 GiB at TP 2
    assert main([*base, "--gpu-memory-utilization", "0.9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --gpu-memory-utilization: nothing left for KV") and err.count("\n") == 1
    with pytest.raises(SystemExit):  # one capacity flag at a time
        main([*base, "--gpu-memory-utilization", "0.9", "--capacity-blocks", "100"])


def test_a_run_on_the_python_pool_says_why_in_one_line(capsys):
    assert main([*SIM, "--host-cache-gib", "1", "--no-hbm-caching", "--quiet"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
    reason = "HBM without caching (--no-hbm-caching) needs the Python pool" if compiled_pool.compiled() else "not built"
    assert len(notes) == 1 and reason in notes[0]
    assert main([*SIM, "--quiet"]) == 0
    assert not compiled_pool.compiled() or "note: " not in capsys.readouterr().err


def test_a_pd_cluster_is_shown_by_its_pools_and_the_legend_says_what_the_columns_are(tmp_path, capsys):
    out = tmp_path / "pd.json"
    assert main(["sim", "--workload", "scm", "--duration", "120", "--prefill-replicas", "1", "--decode-replicas", "2",
                 "--capacity-blocks", "2000", "--max-model-len", "32000", "--no-reuse-distances", "--quiet",
                 "--json", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    [run] = json.loads(out.read_text())["runs"]
    assert run["replicas"] == 0 and run["pd"]["topology"] == {"colocated": 0, "prefill": 1, "decode": 2}
    row = lines[1].split()
    assert row[2] == "1P:2D"  # it printed R 0
    # imbal: max / mean requests over the decode pool, every request decoded once
    decoded = [p["routed"] for p in run["per_replica"] if p["role"] == "decode"]
    assert sum(decoded) == run["served"]  # (counting prefill-0 too, max / mean would be far higher)
    assert row[9] == f"{max(decoded) / (sum(decoded) / 2):.2f}" == f"{run['load_imbalance']:.2f}"
    legend = lines[-3:]
    assert legend[0].startswith("  blk_hit, tok_hit: prompt blocks, tokens found in HBM; CSR:")
    assert "R: replicas (P/D: prefill P:decode D)" in legend[1] and "(P/D: the decode pool)" in legend[1]
    assert legend[2].endswith("more: docs/glossary.md")
