"""`kvemu sweep`: the grid in worker processes, one JSON line per point, resume, CSV, plot, errors."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvemu.cli import main
from loadgen.formats import read_trace, write_kvemu
from loadgen.trace import Trace, TraceRequest
from loadgen.workloads import generate
from replica.core.build import EngineKnobs
from replica.core.tiers.stack import TierSettings
from router.strategies import RoutingSettings
from sim.run import simulate
from sim.simulator import SimSettings
from sim.sweep import CSV_COLUMNS, file_identity, mean_field, point_id, read_records
from sim.sweep_plots import combined_mrc
from tests.support.procs import as_from_a_terminal

GRID = ["--policy", "lru,s3fifo", "--capacity-blocks", "600,2000", "--routing", "cache_aware,session",
        "--replicas", "1,2", "--jobs", "2", "--quiet"]


@pytest.fixture(scope="module")
def swept(trace_file, tmp_path_factory) -> Path:
    """One finished 12-point sweep (R=1 runs once, not once per routing); tests copy its results."""
    out = tmp_path_factory.mktemp("swept") / "results.jsonl"
    argv = ["sweep", "--trace", str(trace_file), *GRID, "--out", str(out), "--csv", str(out.with_suffix(".csv"))]
    assert main(argv) == 0
    return out


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_grid_gives_one_line_per_point_with_the_run_keys(swept):
    recs = lines(swept)
    assert len(recs) == 12
    assert len({r["id"] for r in recs}) == 12
    points = {(r["policy"], r["capacity_blocks"], r["routing"], r["replicas"]) for r in recs}
    # with one replica the routing cannot matter: those points run once, under the first routing
    assert points == {(p, c, rt, k) for p in ("lru", "s3fifo") for c in (600, 2000)
                      for rt, k in (("cache_aware", 1), ("cache_aware", 2), ("session", 2))}
    for r in recs:
        assert r["kind"] == "grid"
        for key in ("id", "trace", "settings", "block_hit_ratio", "token_hit_ratio", "csr", "holes", "ttft_p50_s",
                    "ttft_p99_s", "load_imbalance", "per_replica", "wall_s", "requests", "served"):
            assert key in r, key
        assert r["served"] == r["requests"] == 740
        assert len(r["per_replica"]) == r["replicas"]
        assert r["settings"]["reuse"] == "off"
        assert r["trace"]["digest"] == file_identity(r["trace"]["source"], "kvemu", 16)["digest"]


def test_a_point_equals_simulate_called_directly(swept, trace_file):
    rec = next(r for r in lines(swept) if (r["policy"], r["capacity_blocks"], r["routing"], r["replicas"])
               == ("s3fifo", 600, "session", 2))
    trace = read_trace(trace_file)
    direct = simulate(trace, SimSettings(capacity_blocks=600, replicas=2, routing="session", reuse="off",
                                         routing_settings=RoutingSettings(block_size=16),
                                         knobs=EngineKnobs(policy="s3fifo")))
    stored = {k: v for k, v in rec.items() if k not in ("id", "kind", "trace", "settings")}
    stored.pop("wall_s"), direct.pop("wall_s")
    assert json.dumps(stored, sort_keys=True) == json.dumps(direct, sort_keys=True)


def test_csv_has_one_row_per_point(swept):
    with open(swept.with_suffix(".csv"), newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 12
    assert tuple(rows[0]) == CSV_COLUMNS
    by_id = {r["id"]: r for r in lines(swept)}
    for row in rows:
        assert float(row["block_hit_ratio"]) == by_id[row["id"]]["block_hit_ratio"]
        assert row["max_running"] == "256"


def test_resume_skips_done_points_and_runs_only_missing_ones(swept, trace_file, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    out.write_text(swept.read_text())
    before = out.read_text()
    argv = ["sweep", "--trace", str(trace_file), *GRID, "--out", str(out), "--resume"]
    assert main(argv) == 0
    assert out.read_text() == before  # nothing recomputed, nothing appended

    text = before.splitlines(keepends=True)
    gone = json.loads(text[5])["id"]
    torn = json.loads(text[-1])["id"]
    # delete one line and tear the last one in half, as a kill mid-write would
    out.write_text("".join(text[:5] + text[6:-1]) + text[-1][: len(text[-1]) // 2])
    capsys.readouterr()
    assert main([a for a in argv if a != "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "10 already in" in err and "running 2 on" in err and "1 unreadable line" in err
    records, bad = read_records(str(out))
    assert bad == 1  # the torn line stays, ended by a newline, and is ignored
    assert set(records) == {json.loads(line)["id"] for line in before.splitlines()}
    appended = [json.loads(line)["id"] for line in out.read_text().splitlines()[-2:]]
    assert sorted(appended) == sorted([gone, torn])


def test_existing_results_without_resume_is_an_error(swept, trace_file, capsys):
    rc = main(["sweep", "--trace", str(trace_file), *GRID, "--out", str(swept)])
    assert rc == 2
    assert capsys.readouterr().err.startswith("error: --out:")


@pytest.mark.parametrize("change, field", [
    ({"--policy": "lru,nope"}, "policy"),
    ({"--routing": "sticky"}, "routing"),
    ({"--policy": " , "}, "--policy"),
    ({"--capacity-blocks": ","}, "--capacity-blocks"),
    ({"--replicas": "0"}, "--replicas"),
    ({"--jobs": "0"}, "--jobs"),
])
def test_bad_input_is_one_error_line_and_exit_2_before_any_work(change, field, trace_file, tmp_path, capsys):
    argv = list(GRID)
    for flag, value in change.items():
        argv[argv.index(flag) + 1] = value
    out = tmp_path / "r.jsonl"
    rc = main(["sweep", "--trace", str(trace_file), *argv, "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and field in err
    assert not out.exists()


def test_plot_writes_a_png_with_an_mrc_run_per_combination(trace_file, tmp_path, capsys):
    out, png = tmp_path / "r.jsonl", tmp_path / "sweep.png"
    argv = ["sweep", "--trace", str(trace_file), "--policy", "lru,s3fifo", "--capacity-blocks", "600,1200,2400",
            "--routing", "session", "--replicas", "1,2", "--max-running", "1", "--jobs", "2",
            "--out", str(out), "--plot", str(png)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    # the runs beyond the grid are said for what they are (it said "12 grid points + 2 MRC run(s)")
    assert next(line for line in captured.err.splitlines() if line.startswith("sweep:")) == (
        "sweep: 12 grid points + 2 runs marked +reuse (LRU at the largest capacity, tracking reuse distances for the"
        " figure's miss-ratio curve: one per routing and replica count; not in the table); running 14 on 2 worker(s)")
    table = captured.out.splitlines()
    assert len(table) == 1 + 12 + 3 and table[13].startswith("  blk_hit, tok_hit: prompt blocks, tokens found in HBM;")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    recs = lines(out)
    mrc = [r for r in recs if r["kind"] == "mrc"]
    assert len(recs) == 12 + 2 and len(mrc) == 2
    assert all(r["policy"] == "lru" and r["capacity_blocks"] == 2400 and "reuse" in r["per_replica"][0] for r in mrc)
    # one replica served one request at a time: the MRC is the LRU curve at every capacity
    one = next(r for r in mrc if r["replicas"] == 1)
    xs, ys = combined_mrc(one)
    for r in recs:
        if r["kind"] == "grid" and r["policy"] == "lru" and r["replicas"] == 1 and r["capacity_blocks"] in xs:
            assert ys[list(xs).index(r["capacity_blocks"])] == pytest.approx(r["block_hit_ratio"], abs=1e-9)


def test_combined_mrc_weights_replicas_by_their_accesses():
    def rep(accesses, mrc):
        return {"reuse": {"accesses": accesses, "mrc": mrc}}

    rec = {"per_replica": [rep(100, [[1, 0.0], [10, 0.5], [100, 0.9]]), rep(300, [[1, 0.0], [10, 0.1], [100, 0.5]])]}
    xs, ys = combined_mrc(rec)
    assert list(xs) == [1, 10, 100]
    assert list(ys) == pytest.approx([0.0, (100 * 0.5 + 300 * 0.1) / 400, (100 * 0.9 + 300 * 0.5) / 400])


def test_point_ids_depend_on_settings_and_trace_bytes(trace_file, tmp_path):
    ident = file_identity(str(trace_file), "kvemu", 16)
    a = SimSettings(capacity_blocks=600)
    assert point_id(ident, a) == point_id(dict(ident), SimSettings(capacity_blocks=600))
    assert point_id(ident, a) != point_id(ident, SimSettings(capacity_blocks=601))
    other = tmp_path / "other.jsonl"
    other.write_bytes(trace_file.read_bytes() + b"\n")
    assert point_id(file_identity(str(other), "kvemu", 16), a) != point_id(ident, a)


def test_mean_field_overlay_for_scm_and_for_traces_that_have_conversations(trace_file):
    fn, label = mean_field(read_trace(trace_file), "scm", {"arrival_rate": "0.5"})
    assert "scm" in label and 0 < fn(2000, 1) < fn(2000, 2) < 1  # two replicas hold twice the blocks
    fn, label = mean_field(read_trace(trace_file), None, {})
    assert "trace" in label and 0 < fn(2000, 1) < 1
    single = Trace([TraceRequest(float(i), f"s{i}", 0, [i], 16, 1) for i in range(5)], block_size=16)
    assert mean_field(single, None, {}) is None  # no multi-turn session: no think-time law


def test_ctrl_c_stops_workers_and_keeps_finished_points(tmp_path):
    path = tmp_path / "big.jsonl"
    write_kvemu(generate("scm", 3600, seed=1), path)
    out = tmp_path / "r.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "kvemu", "sweep", "--trace", str(path), "--policy", "lru,s3fifo,arc,random_compute",
                             "--capacity-blocks", "2000,3000,4000,6000,8000", "--max-running", "1", "--jobs", "2",
                             "--out", str(out)], stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=as_from_a_terminal)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (out.exists() and out.read_text().count("\n") >= 1):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: the whole process group
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "rerun with --resume" in err
    done = lines(out)
    assert 1 <= len(done) < 20
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # no worker outlived the sweep


def test_cache_only_table_shows_no_ttft_as_a_dash(trace_file, tmp_path, capsys):
    out = tmp_path / "co.jsonl"
    argv = ["sweep", "--trace", str(trace_file), "--policy", "lru", "--capacity-blocks", "600",
            "--replicas", "1", "--cache-only", "--jobs", "1", "--out", str(out), "--plot", str(tmp_path / "co.png")]
    assert main(argv) == 0
    assert (tmp_path / "co.png").stat().st_size > 10_000  # the TTFT panel says why it is empty
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("lru ")]
    assert len(row) == 1 and row[0].split()[8:10] == ["-", "-"]  # ttft p50 / p99: no clock
    assert lines(out)[0]["ttft_p50_s"] is None


def test_point_ids_of_default_settings_predate_the_scheduler_setting(trace_file):
    ident = file_identity(str(trace_file), "kvemu", 16)
    fcfs = SimSettings(capacity_blocks=600)
    flat = dataclasses.asdict(fcfs)
    flat.update(flat.pop("knobs"))  # the knobs were SimSettings' own fields then
    later = ("scheduler", "max_model_len", "prefix_caching", "pd", "data_parallel_size", "expert_parallel", "arrivals",
             "speculative")
    before = {k: v for k, v in flat.items() if k not in later}
    del before["tiers"]["deeper"]  # nor memory levels below SSD
    del before["tiers"]["shared"]  # nor a shared KV store
    blob = json.dumps({"trace": ident, "settings": before}, sort_keys=True, default=str, separators=(",", ":"))
    assert point_id(ident, fcfs) == hashlib.sha256(blob.encode()).hexdigest()[:16]  # as before `scheduler`
    assert point_id(ident, SimSettings(capacity_blocks=600, knobs=EngineKnobs(scheduler="reorder"))) != point_id(ident, fcfs)


def test_a_point_id_says_whether_response_kv_was_kept(trace_file):
    # sim and sweep used to drop response KV by default: those results keep their ids under
    # --response-kv drop, and a sweep at today's default (keep) recomputes them instead of resuming
    ident = file_identity(str(trace_file), "kvemu", 16)
    keep = SimSettings(capacity_blocks=600)
    drop = dataclasses.replace(keep, knobs=dataclasses.replace(keep.knobs, response_kv="drop"))
    assert keep.knobs.response_kv == "keep"
    assert point_id(ident, keep) != point_id(ident, drop)
    assert point_id(ident, drop) == point_id(ident, SimSettings(capacity_blocks=600,
                                                                knobs=EngineKnobs(response_kv="drop")))


def test_point_ids_hold_across_the_knobs_record():
    """The ids of points written before the knobs were one record (EngineKnobs): measured at 3292a57, when
    SimSettings held each knob as a field of its own."""
    ident = {"digest": "x", "format": "kvemu", "block_size": 16}
    knobs = EngineKnobs(policy="s3fifo", policy_params=(("a", 1),), hit_mode="holes", token_budget=4096, max_running=8,
                        scheduler="reorder", watermark=0.01, step_rule="v0", max_loans=3, decode_kv=False,
                        response_kv="drop", tiers=TierSettings(host_blocks=100), shards_rate=0.5, seed=5)
    assert point_id(ident, SimSettings(capacity_blocks=600, knobs=knobs, replicas=2, routing="session")) \
        == "ffedc97f0eb6bfb9"
    assert point_id(ident, SimSettings(capacity_blocks=600)) == "2b19397e3ca0ac5b"
