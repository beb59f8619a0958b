"""``--requests-out``: one JSON line per request from ``kvemu sim`` (exact, worked by hand from the cost model) and
from ``kvemu replay`` against a real kvemu replica over OpenAI's streamed completions."""

from __future__ import annotations

import json

import pytest

from kvemu.cli import main
from loadgen.request_metrics import FIELDS, read_requests, summarize
from shared.costmodel import CostModel
from tests.loadgen.test_token_trace import sample_lines, write_lines
from tests.support.procs import start_replica

SIM = ["sim", "--block-size", "4", "--capacity-blocks", "100", "--max-model-len", "64", "--quiet"]


def test_sim_writes_every_request_with_hand_worked_times(tmp_path, capsys):
    trace = write_lines(tmp_path / "w.jsonl", sample_lines())
    out, runs = tmp_path / "requests.jsonl", tmp_path / "runs.json"
    assert main([*SIM, "--trace", trace, "--requests-out", str(out), "--json", str(runs)]) == 0
    assert f"requests: 5 written to {out}" in capsys.readouterr().err
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [tuple(obj) for obj in lines] == [FIELDS] * 5  # exactly these fields, in this order
    recs = read_requests(out)
    assert [r.index for r in recs] == [0, 1, 2, 3, 4] and [r.arrival_s for r in recs] == [0.0, 10.0, 20.0, 30.0, 30.0]
    # request 1 finds request 0's prompt and its response block (tokens 500..503, hashed from its output ids): 24
    # tokens; request 4's 8 tokens are two of request 0's blocks, but vLLM computes a whole-cached prompt's last block
    assert [r.cached_tokens for r in recs] == [0, 24, 0, None, 4]
    assert [r.replica for r in recs] == ["replica-0"] * 3 + [None, "replica-0"]
    assert [r.preemptions for r in recs] == [0, 0, 0, None, 0]
    assert (recs[3].first_token_s, recs[3].finish_s) == (None, None)  # 70 tokens over --max-model-len 64: refused
    cost = CostModel.from_names()  # the default model and GPU; each request runs alone
    assert recs[0].first_token_s == pytest.approx(cost.prefill_time(20), rel=1e-12)
    assert recs[1].first_token_s - 10.0 == pytest.approx(cost.prefill_time(6, 24), rel=1e-9)
    decodes = sum(cost.decode_step_time(1, 21 + i) for i in range(5))  # 5 more tokens; KV 21, 22, ... tokens
    assert recs[0].finish_s - recs[0].first_token_s == pytest.approx(decodes, rel=1e-9)
    assert recs[2].finish_s == recs[2].first_token_s  # one output token: done at its first
    latency = json.loads(runs.read_text())["runs"][0]["latency"]
    assert latency == {**summarize(recs), "requests": 5} and latency["finished"] == 4
    assert latency["makespan_s"] == recs[4].finish_s and latency["itl_mean_s"] is None


def test_sim_refuses_requests_out_for_a_grid_or_a_cache_only_run(tmp_path, capsys):
    trace = write_lines(tmp_path / "w.jsonl", sample_lines())
    out = tmp_path / "r.jsonl"
    assert main([*SIM, "--trace", trace, "--policy", "lru,s3fifo", "--requests-out", str(out)]) != 0
    assert "--requests-out: writes one run's requests, but the flags ask for 2 runs" in capsys.readouterr().err
    assert main([*SIM, "--trace", trace, "--cache-only", "--requests-out", str(out)]) != 0
    assert "--requests-out: a --cache-only run has no clock" in capsys.readouterr().err
    assert not out.exists()


def test_replay_requests_out_against_a_real_replica(tmp_path, capsys):
    lines = sample_lines()[:3]
    for i, obj in enumerate(lines):  # 0.05 s apart, so the three leave in order
        obj["arrival_time_ns"] = 50_000_000 * i
    trace = write_lines(tmp_path / "w.jsonl", lines)
    replica = start_replica(replica_id="r-1")
    try:
        out = tmp_path / "replayed.jsonl"
        assert main(["replay", "--url", replica.url, "--trace", trace, "--requests-out", str(out), "--quiet"]) == 0
    finally:
        replica.stop()
    assert "requests 3 to qwen3-coder-30b-a3b" in capsys.readouterr().out
    recs = read_requests(out)
    assert [(r.index, r.input_tokens, r.output_tokens) for r in recs] == [(0, 20, 6), (1, 30, 3), (2, 17, 1)]
    # the replica's blocks are 16 tokens: request 1 shares request 0's first 16 prompt tokens (its output, kvemu's
    # own filler, is not request 1's); the usage reports them
    assert [r.cached_tokens for r in recs] == [0, 16, 0]
    assert [r.replica for r in recs] == ["r-1"] * 3 and [r.preemptions for r in recs] == [None] * 3
    for r, due in zip(recs, (0.0, 0.05, 0.1)):
        assert due <= r.arrival_s < due + 0.5
        assert r.first_token_s is not None and r.finish_s is not None
        assert r.arrival_s < r.first_token_s <= r.finish_s


def test_a_pd_run_writes_the_same_fields_from_its_decode_instances(tmp_path):
    trace = write_lines(tmp_path / "w.jsonl", sample_lines())
    out, runs = tmp_path / "pd.jsonl", tmp_path / "runs.json"
    assert main([*SIM, "--trace", trace, "--prefill-replicas", "1", "--decode-replicas", "1", "--requests-out", str(out),
                 "--json", str(runs)]) == 0
    recs = read_requests(out)
    assert [r.replica for r in recs] == ["decode-0"] * 3 + [None, "decode-0"]  # the first token comes from there
    assert [r.arrival_s for r in recs] == [0.0, 10.0, 20.0, 30.0, 30.0]
    assert json.loads(runs.read_text())["runs"][0]["latency"] == summarize(recs)
