"""`kvemu compare`: the table, --json and --plot on the three requests of tests/loadgen/test_compare.py, and
one error line, with nothing written, for runs of other requests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.kvemu.test_stats_cmd import kvemu_exe
from tests.loadgen.test_compare import MEASURED, PREDICTED, kvemu_lines, write


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([kvemu_exe(), "compare", *map(str, args)], capture_output=True, text=True, timeout=60)


def test_table_json_and_figure(tmp_path):
    m = write(tmp_path, "distserve", MEASURED)
    p = write(tmp_path, "kvemu", PREDICTED, "p.jsonl")
    proc = run_cli(m, p, "--json", tmp_path / "cmp.json", "--plot", tmp_path / "cmp.png")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"measured   {m} (DistServe .exp, 3 requests, 3 finished)"
    # TTFT mean 3.5 / 3 s against 4.75 / 3 s: +5/14 (seconds, a mean of a second or more); ITL only as a mean
    assert f"{'TTFT mean (s)':<30}{'1.167':>14}{'1.583':>14}{'+35.7%':>12}" in lines
    assert f"{'TPOT mean (ms)':<30}{'750.0':>14}{'562.5':>14}{'-25.0%':>12}" in lines
    assert f"{'ITL mean * (ms)':<30}{'666.7':>14}{'583.3':>14}{'-12.5%':>12}" in lines
    assert f"{'E2E':<30}{'33.3%':>14}{'46.7%':>14}{3:>12}" in lines
    assert not any(line.startswith("ITL p50") for line in lines)
    doc = json.loads((tmp_path / "cmp.json").read_text())
    assert doc["measured"]["format"] == "distserve" and doc["predicted"]["requests"] == 3
    assert doc["figures"]["e2e_mean_s"] == {"measured": 2.5, "predicted": 2.75, "rel_error": pytest.approx(0.1)}
    assert doc["per_request_abs_rel_error"]["ttft"] == {"pairs": 3, "median": 0.5, "p90": 0.5}
    png = (tmp_path / "cmp.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert "plot written to" in proc.stderr


def test_runs_of_other_requests_are_one_error_line_and_nothing_written(tmp_path):
    m = write(tmp_path, "llmservingsim", MEASURED)
    other = tmp_path / "other.jsonl"
    other.write_text(kvemu_lines(PREDICTED, [(100, 5), (200, 4), (300, 1)]))
    proc = run_cli(m, other, "--json", tmp_path / "cmp.json", "--plot", tmp_path / "cmp.png")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"error: request 1: output_tokens 3 in {m} but 4 in {other}: compare two runs of the "
                           "same requests\n")
    assert set(tmp_path.iterdir()) == {m, other}


def test_json_to_stdout_moves_the_table_to_stderr(tmp_path):
    m = write(tmp_path, "kvemu", MEASURED, "m.jsonl")
    proc = run_cli(m, m, "--json", "-")
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["figures"]["makespan_s"] == {"measured": 4.0, "predicted": 4.0, "rel_error": 0.0}
    assert proc.stderr.startswith("measured   ")


def test_the_docs_excerpt_is_what_the_table_prints(tmp_path):
    """docs/validation.md shows part of this table: each of its lines as the command prints it."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "validation.md").read_text()
    excerpt = text[text.index("reads in part:"):].split("```text\n", 1)[1].split("```", 1)[0]
    m = write(tmp_path, "llmservingsim", MEASURED)
    proc = run_cli(m, write(tmp_path, "kvemu", PREDICTED, "p.jsonl"))
    printed = proc.stdout.splitlines()
    shown = [line for line in excerpt.splitlines() if line]
    assert len(shown) == 6 and [line for line in shown if line not in printed] == []
