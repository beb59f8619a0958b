"""``kvemu gen``: writes a readable trace, lists presets, and reports bad input in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvemu.cli import main
from loadgen.formats import read_kvemu
from loadgen.workloads import PRESETS, generate

KVEMU = str(Path(sys.executable).with_name("kvemu"))


def test_gen_writes_a_trace_read_kvemu_reads_back(tmp_path, capsys):
    out = tmp_path / "scm.jsonl"
    rc = main(["gen", "--workload", "scm", "--duration", "300", "--seed", "3", "-o", str(out),
               "--set", "continue_prob=0.5", "--set", "prompt_blocks=2"])
    assert rc == 0
    trace = read_kvemu(out)
    expected = generate("scm", 300, 3, {"continue_prob": "0.5", "prompt_blocks": "2"})
    assert trace.block_size == 16
    assert trace.meta["workload"] == "scm" and trace.meta["seed"] == 3
    assert trace.meta["params"]["continue_prob"] == 0.5
    assert [(r.session, r.turn, r.hash_ids, r.input_tokens, r.output_tokens, r.kind) for r in trace.requests] == \
        [(r.session, r.turn, r.hash_ids, r.input_tokens, r.output_tokens, r.kind) for r in expected.requests]
    assert [r.t for r in trace.requests] == pytest.approx([r.t for r in expected.requests], abs=1e-6)
    assert all(r.input_tokens == 16 * (2 + 18 * r.turn) for r in trace.requests)
    line = capsys.readouterr().out.strip()
    assert len(line.splitlines()) == 1
    assert f"{len(trace.requests)} requests" in line and str(out) in line


def test_gen_mix_with_dotted_override(tmp_path):
    out = tmp_path / "mix.jsonl"
    assert main(["gen", "-w", "mix", "--duration", "120", "--set", "multi.turns_mean=8", "-o", str(out)]) == 0
    assert read_kvemu(out).meta["params"]["multi"]["turns_mean"] == 8.0


def test_list_shows_presets_parameters_and_defaults(capsys):
    assert main(["gen", "--list"]) == 0
    text = capsys.readouterr().out
    for name in PRESETS:
        assert f"{name}:" in text
    assert "    arrival_rate=0.3" in text and "    continue_prob=0.8" in text
    assert "    multi.turns_mean=7" in text


def test_unknown_workload_lists_names_and_exits_2(tmp_path, capsys):
    rc = main(["gen", "--workload", "nope", "-o", str(tmp_path / "x.jsonl")])
    assert rc == 2
    err = capsys.readouterr().err
    assert err == ("error: unknown workload 'nope'; valid: agent, chat, freeinference, mix, scm, single"
                   " (`kvemu gen --list` shows their parameters)\n")  # one line, not the whole listing
    assert not (tmp_path / "x.jsonl").exists()


@pytest.mark.parametrize("argv, field", [
    (["--set", "nope=1"], "nope"),
    (["--set", "continue_prob=2"], "continue_prob"),
    (["--set", "arrival_rate=fast"], "arrival_rate"),
    (["--set", "novalue"], "--set"),
    (["--duration", "0"], "duration"),
])
def test_bad_input_is_one_error_line(tmp_path, capsys, argv, field):
    rc = main(["gen", "--workload", "scm", "-o", str(tmp_path / "x.jsonl"), *argv])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {field}:") and len(err.splitlines()) == 1


def test_missing_workload_or_output_and_unwritable_output(tmp_path, capsys):
    assert main(["gen", "-o", str(tmp_path / "x.jsonl")]) == 2
    assert "--workload" in capsys.readouterr().err
    assert main(["gen", "--workload", "scm"]) == 2
    assert "--output" in capsys.readouterr().err
    assert main(["gen", "--workload", "scm", "--duration", "10", "-o", str(tmp_path / "no" / "x.jsonl")]) == 2
    assert capsys.readouterr().err.startswith("error: --output: cannot write")


def test_console_script_bad_preset_exits_2_without_traceback(tmp_path):
    proc = subprocess.run([KVEMU, "gen", "--workload", "nope", "--duration", "10", "-o", str(tmp_path / "x.jsonl")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "error: unknown workload 'nope'" in proc.stderr


def test_console_script_writes_a_trace(tmp_path):
    out = tmp_path / "chat.jsonl"
    proc = subprocess.run([KVEMU, "gen", "--workload", "chat", "--duration", "60", "--seed", "1", "-o", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert read_kvemu(out).requests
