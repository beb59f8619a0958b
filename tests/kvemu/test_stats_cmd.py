"""`kvemu trace-stats`: table and JSON output, and one-line errors with exit status 2."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvemu import stats_cmd
from tests.conftest import MOONCAKE_CONVERSATION as CONVERSATION
from tests.conftest import MOONCAKE_SYNTHETIC as SYNTHETIC


def kvemu_exe() -> str:
    exe = Path(sys.executable).parent / "kvemu"
    found = str(exe) if exe.exists() else shutil.which("kvemu")
    if found is None:
        pytest.fail("the kvemu console script is not installed next to this Python")
    return found


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([kvemu_exe(), "trace-stats", *args], capture_output=True, text=True, timeout=60)


def run_inprocess(capsys, *argv: str) -> tuple[int, str]:
    parser = argparse.ArgumentParser()
    stats_cmd.configure(parser)
    rc = stats_cmd.run(parser.parse_args(list(argv)))
    return rc, capsys.readouterr().out


def need(path: Path) -> Path:
    assert path.exists(), f"sample trace {path} is missing from the package"
    return path


def test_malformed_file_exits_2_with_one_error_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
        '{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [0, "two"]}\n'
    )
    proc = run_cli(str(path))
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.startswith("error: ")
    assert f"{path}:2:" in proc.stderr and "hash_ids[1]" in proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize(
    "args, needle",
    [(("--format", "sharegpt"), "valid: agentic-mooncake, auto, bailian, cc-traces, kvemu, llmservingsim, mooncake, openai"),
     ((), "no file ")],
)
def test_bad_format_or_missing_file(tmp_path, args, needle):
    proc = run_cli(str(tmp_path / "missing.jsonl"), *args)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: ") and needle in proc.stderr
    assert "Traceback" not in proc.stderr


def test_json_output_on_synthetic_trace():
    proc = run_cli(str(need(SYNTHETIC)), "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert (d["requests"], d["block_accesses"], d["distinct_blocks"]) == (3_993, 121_877, 43_924)
    assert round(d["infinite_cache_block_hit"], 3) == 0.640
    for key in ("sessions", "turns_per_session", "intra_session_gap_s", "session_footprint_blocks", "input_tokens_per_request"):
        assert key in d
    assert set(d["turns_per_session"]) == {"count", "mean", "p50", "p90", "p99", "max"}


def test_table_on_conversation_trace(capsys):
    rc, out = run_inprocess(capsys, str(need(CONVERSATION)))
    assert rc == 0
    for needle in ("12,031", "288,500", "182,790", "0.366", "turns per session", "intra-session gap"):
        assert needle in out


def test_json_inprocess_with_format_and_block_size(capsys):
    rc, out = run_inprocess(capsys, str(need(CONVERSATION)), "--format", "mooncake", "--block-size", "256", "--json")
    assert rc == 0
    d = json.loads(out)
    assert (d["requests"], d["block_accesses"], d["distinct_blocks"]) == (12_031, 288_500, 182_790)
    assert round(d["infinite_cache_block_hit"], 3) == 0.366
    assert d["block_size"] == 256


def test_kinds_in_table(tmp_path, capsys):
    path = tmp_path / "k.jsonl"
    path.write_text(
        '{"t": 0, "session": "a", "turn": 0, "hash_ids": [1, 2], "input_tokens": 32, "output_tokens": 1, "kind": "agent"}\n'
        '{"t": 1, "session": "b", "turn": 0, "hash_ids": [1], "input_tokens": 16, "output_tokens": 1, "kind": "single"}\n'
    )
    rc, out = run_inprocess(capsys, str(path))
    assert rc == 0 and "agent" in out and "single" in out


def test_block_size_must_be_positive(tmp_path):
    proc = run_cli(str(tmp_path / "x.jsonl"), "--block-size", "0")
    assert proc.returncode == 2 and "positive integer" in proc.stderr
