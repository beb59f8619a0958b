"""`kvemu replay` against a real one-replica cluster (router + replica processes on loopback).

Hand-made traces make every expected number exact: with one replica and ample capacity,
turn j+1 reuses turn j's full blocks, and a second session reuses a shared system prompt.
Timing tests check open loop across sessions and causality within one.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import signal
import subprocess
import time
import urllib.request

import pytest

from kvemu.up import add_cluster_args, bring_up, validate
from loadgen.formats import write_kvemu
from loadgen.trace import Trace, TraceRequest
from shared.hashing import chain_ids, content_id
from tests.conftest import free_port
from tests.support.kvemu_cli import REPO, kvemu_cmd, run_kvemu
from tests.support.procs import as_from_a_terminal

# Real processes on loopback: an end-to-end test (CI runs it; `-m "not slow"` skips it locally).
pytestmark = pytest.mark.slow

BS = 16
TAIL = 5  # tokens of the partial last block of every prompt (never cached)
TIME_SCALE = 0.1  # one decode step of the default model at batch 1 (~1.7 ms emulated: 8 of 128 experts read) sleeps ~0.17 ms
LONG_OUT = 3600  # tokens that decode in ~0.6 s of wall at this time scale


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    p = argparse.ArgumentParser()
    add_cluster_args(p, replicas=1)
    args = p.parse_args(["--capacity-blocks", "4000", "--time-scale", str(TIME_SCALE), "--routing", "session"])
    args.port = 0
    c = bring_up(validate(args), log_dir=str(tmp_path_factory.mktemp("cluster-logs")))
    try:
        yield c
    finally:
        c.stop()


def prompt(tag: str, session: str, system_blocks: int, own_blocks: int) -> list[int]:
    ids = [content_id(tag, "system", i) for i in range(system_blocks)]
    ids += [content_id(tag, session, i) for i in range(own_blocks)]
    return chain_ids(ids)


def request(t: float, tag: str, session: str, turn: int, own_blocks: int, out: int = 1, system: int = 2):
    hashes = prompt(tag, session, system, own_blocks)
    return TraceRequest(t, session, turn, hashes, len(hashes) * BS + TAIL, out, "multi")


def write(tmp_path, reqs, name="trace.jsonl", block_size=BS) -> str:
    path = tmp_path / name
    write_kvemu(Trace(sorted(reqs, key=lambda r: r.t), block_size, "hand-made"), path)
    return str(path)


def replay(url: str, trace: str, *extra: str, speedup: float = 1.0, timeout: float = 60.0):
    return run_kvemu("replay", "--url", url, "--trace", trace, "--speedup", str(speedup), *extra, timeout=timeout)


def load(path) -> dict:
    with open(path) as fh:
        return json.load(fh)


def by_key(records: list[dict]) -> dict[tuple[str, int], dict]:
    return {(r["session"], r["turn"]): r for r in records}


def test_records_and_summary_have_exact_cached_tokens(cluster, tmp_path):
    # A: 2 system + 1, then +3, then +3 own blocks; B starts after A's turn 0 (shares the system prompt).
    reqs = [request(0.0, "exact", "A", 0, 1), request(0.2, "exact", "A", 1, 4), request(0.4, "exact", "A", 2, 7),
            request(0.3, "exact", "B", 0, 1), request(0.5, "exact", "B", 1, 3), request(0.7, "exact", "B", 2, 6)]
    expect_blocks = {("A", 0): 0, ("A", 1): 3, ("A", 2): 6, ("B", 0): 2, ("B", 1): 3, ("B", 2): 5}
    out = tmp_path / "out.json"
    res = replay(cluster.router_url, write(tmp_path, reqs), "--json", str(out))
    assert res.returncode == 0, res.stderr
    assert "replay: 100%" in res.stderr and "6/6" in res.stderr  # the tqdm bar ends complete
    assert "failed 0, on schedule" in res.stderr and re.search(r"\[\d\d:\d\d<\d\d:\d\d", res.stderr)  # ETA
    doc = load(out)
    assert set(doc) == {"summary", "cluster", "records"}
    recs = by_key(doc["records"])
    assert set(recs) == set(expect_blocks)
    for r in reqs:
        rec = recs[(r.session, r.turn)]
        assert rec["status"] == 200 and rec["error"] == "" and rec["replica"] == "replica-0"
        assert rec["prompt_tokens"] == r.input_tokens and rec["prompt_blocks"] == len(r.hash_ids)
        assert rec["cached_blocks"] == expect_blocks[(r.session, r.turn)], (r.session, r.turn)
        assert rec["cached_tokens"] == BS * expect_blocks[(r.session, r.turn)]
        assert 0 < rec["ttft_s"] <= rec["e2e_s"] and rec["wall_s"] > 0 and rec["sent_at_s"] >= 0

    s = doc["summary"]
    prompt_tokens = sum(r.input_tokens for r in reqs)
    prompt_blocks = sum(len(r.hash_ids) for r in reqs)
    cached = sum(expect_blocks.values())
    assert (s["requests"], s["ok"], s["failed"], s["statuses"]) == (6, 6, 0, {"200": 6})
    assert s["token_hit_ratio"] == pytest.approx(cached * BS / prompt_tokens)
    assert s["block_hit_ratio"] == pytest.approx(cached / prompt_blocks)
    per = s["per_replica"]["replica-0"]
    assert (per["requests"], per["prompt_tokens"], per["cached_tokens"]) == (6, prompt_tokens, cached * BS)
    assert per["token_hit_ratio"] == pytest.approx(cached * BS / prompt_tokens)
    assert per["block_hit_ratio"] == pytest.approx(cached / prompt_blocks)
    assert s["load_imbalance"] == 1.0 and 0 < s["ttft_p50_s"] <= s["ttft_p99_s"]
    # The cluster part comes from the replicas' /stats and the router's /cluster.
    assert set(doc["cluster"]["replicas"]["replica-0"]) == {"run", "lifetime"} and doc["cluster"]["hotspots"] == []
    assert 0 < doc["cluster"]["csr"] <= 1 and doc["summary"]["interrupted"] is False
    # The printed report carries the same numbers.
    assert f"token hit ratio (HBM) {s['token_hit_ratio']:.4f}" in res.stdout
    assert "replica-0" in res.stdout and "6 (6 ok, 0 failed)" in res.stdout


def test_open_loop_across_sessions_causal_within_one(cluster, tmp_path):
    speedup = 2.0
    # C's turn 0 decodes LONG_OUT tokens (~0.6 s of wall at this time scale), far longer than any jitter.
    reqs = [request(0.0, "timing", "C", 0, 1, out=LONG_OUT), request(1.0, "timing", "C", 1, 3),
            request(1.2, "timing", "D", 0, 1), request(4.0, "timing", "D", 1, 2)]
    out = tmp_path / "out.json"
    res = replay(cluster.router_url, write(tmp_path, reqs), "--json", str(out), "--quiet", speedup=speedup)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""  # --quiet: no progress bar
    recs = by_key(load(out)["records"])
    c0, c1, d0, d1 = recs[("C", 0)], recs[("C", 1)], recs[("D", 0)], recs[("D", 1)]
    tol = 0.02
    # Open loop: each session's first turn leaves at its trace time / speed-up, whatever C is doing.
    assert c0["sent_at_s"] == pytest.approx(0.0, abs=0.1)
    assert d0["sent_at_s"] == pytest.approx(1.2 / speedup, abs=0.1)
    # Causal: C's turn 1 waits for turn 0's answer, then the trace gap / speed-up.
    assert c0["wall_s"] > 0.3, c0  # long enough that open loop (0.5 s) and causal differ
    earliest = c0["sent_at_s"] + c0["wall_s"] + (1.0 - 0.0) / speedup
    assert earliest - tol <= c1["sent_at_s"] <= earliest + 0.25, (c0, c1)
    earliest = d0["sent_at_s"] + d0["wall_s"] + (4.0 - 1.2) / speedup
    assert earliest - tol <= d1["sent_at_s"] <= earliest + 0.25, (d0, d1)
    assert c0["e2e_s"] > c0["ttft_s"] > 0  # emulated: 400 decode steps after the first token


def test_max_requests_keeps_the_first_requests_in_trace_order(cluster, tmp_path):
    reqs = [request(0.05 * i, "maxreq", f"S{i % 3}", i // 3, 1 + i // 3) for i in range(9)]
    out = tmp_path / "out.json"
    res = replay(cluster.router_url, write(tmp_path, reqs), "--max-requests", "4", "--json", str(out), "--quiet",
                 speedup=4.0)
    assert res.returncode == 0, res.stderr
    doc = load(out)
    assert sorted(by_key(doc["records"])) == sorted((r.session, r.turn) for r in reqs[:4])
    assert doc["summary"]["requests"] == 4


def test_workload_preset_with_overrides_and_plot(cluster, tmp_path):
    out, png = tmp_path / "out.json", tmp_path / "replay.png"
    res = run_kvemu("replay", "--url", cluster.router_url, "--workload", "chat", "--set", "session_rate=2",
                    "--set", "response_median=20", "--duration", "30", "--seed", "4", "--speedup", "50",
                    "--max-requests", "10", "--json", str(out), "--plot", str(png), "--quiet", timeout=90)
    assert res.returncode == 0, res.stderr
    doc = load(out)
    assert doc["summary"]["ok"] == 10 and len(doc["records"]) == 10
    assert all(r["replica"] == "replica-0" for r in doc["records"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_bad_url_exits_2_with_one_clear_line(tmp_path):
    trace = write(tmp_path, [request(0.0, "bad", "A", 0, 1)])
    url = f"http://127.0.0.1:{free_port()}"
    res = replay(url, trace)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and url in lines[0] and "kvemu up" in lines[0]
    assert "Traceback" not in res.stderr and res.stdout == ""


@pytest.mark.parametrize("extra, field", [
    (["--max-requests", "0"], "--max-requests"),
    (["--connections", "0"], "--connections"),
    (["--speedup", "0"], "--speedup"),
    (["--timeout", "0"], "--timeout"),
])
def test_bad_numbers_exit_2(cluster, tmp_path, extra, field):
    res = run_kvemu("replay", "--url", cluster.router_url, "--trace", write(tmp_path, [request(0, "n", "A", 0, 1)]),
                    *extra)
    assert res.returncode == 2 and res.stderr.startswith(f"error: {field}"), res.stderr


def test_trace_block_size_must_match_the_cluster(cluster, tmp_path):
    trace = write(tmp_path, [request(0.0, "bs", "A", 0, 1)], block_size=32)
    res = replay(cluster.router_url, trace)
    assert res.returncode == 2, res.stdout
    assert "32-token blocks" in res.stderr and "uses 16" in res.stderr and "--block-size 32" in res.stderr


def test_report_separates_this_run_from_the_replicas_lifetime(cluster, tmp_path):
    """The same trace twice: the second run hits every full block; the replica's lifetime
    counters still carry the first run's misses, and the report keeps the two apart."""
    reqs = [request(0.0, "twice", "T", 0, 2), request(0.1, "twice", "T", 1, 4), request(0.0, "twice", "U", 0, 3)]
    trace = write(tmp_path, reqs)
    first = replay(cluster.router_url, trace, "--quiet", speedup=4.0)
    assert first.returncode == 0, first.stderr
    out, rows = tmp_path / "second.json", tmp_path / "second.csv"
    second = replay(cluster.router_url, trace, "--quiet", "--json", str(out), "--csv", str(rows), speedup=4.0)
    assert second.returncode == 0, second.stderr
    doc = load(out)
    assert doc["summary"]["block_hit_ratio"] == 1.0
    rep = doc["cluster"]["replicas"]["replica-0"]
    assert doc["cluster"]["csr"] == pytest.approx(1.0)
    assert rep["run"] == {"csr": pytest.approx(1.0), "evictions": 0, "aborted": 0}
    assert rep["lifetime"]["block_hit_ratio"] < 1.0  # earlier tests' and the first run's misses
    lines = second.stdout.splitlines()
    run_head = lines.index("  this run         requests  tok_hit  blk_hit     CSR  evictions  aborted")
    life_head = next(i for i, ln in enumerate(lines) if ln.startswith("  lifetime         blk_hit"))
    assert lines[run_head + 1].split()[:2] == ["replica-0", "3"] and lines[run_head + 1].split()[3:5] == [
        "1.0000", "1.0000"]
    assert lines[life_head + 1].split()[1] == f"{rep['lifetime']['block_hit_ratio']:.4f}"
    assert second.stderr == f"csv: 3 rows written to {rows}\n"
    with open(rows, newline="") as fh:
        table = list(csv.DictReader(fh))
    assert sorted((r["session"], int(r["turn"]), int(r["cached_blocks"])) for r in table) == [
        ("T", 0, 4), ("T", 1, 6), ("U", 0, 5)]


def test_ctrl_c_stops_cleanly_and_keeps_what_ran(cluster, tmp_path):
    reqs = [request(0.5 * i, "ctrlc", f"K{i}", 0, 1) for i in range(40)]  # 20 s of trace time
    out, png, rows = tmp_path / "partial.json", tmp_path / "partial.png", tmp_path / "partial.csv"
    proc = subprocess.Popen(kvemu_cmd("replay", "--url", cluster.router_url, "--trace", write(tmp_path, reqs),
                                      "--json", str(out), "--plot", str(png), "--csv", str(rows)),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=as_from_a_terminal)
    time.sleep(3.0)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    doc = load(out)
    done = len(doc["records"])
    assert 2 <= done < 40 and doc["summary"]["interrupted"] is True
    assert all(r["status"] == 200 for r in doc["records"])  # in-flight requests are dropped, not failed
    assert f"replay: interrupted after {done} of 40 requests; reporting those" in stderr
    assert f"requests        {done} ({done} ok, 0 failed)   INTERRUPTED: partial run" in stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(rows.read_text().splitlines()) == done + 1


def test_progress_says_when_replay_falls_behind_schedule(cluster, tmp_path):
    """Six sessions due at once through one connection, each decoding LONG_OUT tokens (~0.6 s):
    the last leaves seconds late, and the bar says so."""
    reqs = [request(0.0, "late", f"L{i}", 0, 1, out=LONG_OUT) for i in range(6)]
    res = replay(cluster.router_url, write(tmp_path, reqs), "--connections", "1")
    assert res.returncode == 0, res.stderr
    late = re.findall(r"behind schedule (\d+\.\d)s", res.stderr)
    assert late and float(late[-1]) >= 2.0, res.stderr


def test_a_request_that_times_out_is_counted_and_the_replica_aborts_it(cluster, tmp_path):
    """--timeout 1 and a request decoding 60,000 tokens (~10 s at this time scale): the replay drops
    it after a second; its record and the summary say it timed out, and the replica, which saw its
    client leave, aborted it: this run's counter deltas show one abort and no request left running."""
    reqs = [request(0.0, "timeout", "Q", 0, 1, out=60_000), request(0.0, "timeout", "R", 0, 1)]
    out = tmp_path / "out.json"
    res = replay(cluster.router_url, write(tmp_path, reqs), "--timeout", "1", "--json", str(out), "--quiet")
    assert res.returncode == 1, res.stderr  # a failed request
    doc = load(out)
    recs = by_key(doc["records"])
    q, r = recs[("Q", 0)], recs[("R", 0)]
    assert (q["status"], q["timed_out"], q["error"]) == (0, True, "timed out after 1 s") and 1.0 <= q["wall_s"] < 2.0
    assert (r["status"], r["timed_out"], r["error"]) == (200, False, "")
    s = doc["summary"]
    assert (s["requests"], s["ok"], s["failed"], s["timed_out"], s["statuses"]) == (2, 1, 1, 1, {"0": 1, "200": 1})
    assert doc["cluster"]["replicas"]["replica-0"]["run"]["aborted"] == 1
    assert "2 (1 ok, 1 failed, 1 timed out)" in res.stdout
    lines = res.stdout.splitlines()
    row = lines[lines.index("  this run         requests  tok_hit  blk_hit     CSR  evictions  aborted") + 1].split()
    assert row[0] == "replica-0" and row[1] == "1" and row[-1] == "1"
    with urllib.request.urlopen(cluster.replica_urls[0] + "/health", timeout=5) as resp:
        assert json.load(resp)["running"] == 0  # nothing left decoding
