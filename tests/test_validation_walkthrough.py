"""docs/validation.md's walk-through, as a new user types it: record a run of a server with `kvemu replay
--requests-out`, calibrate from the shipped operator profile, simulate the same file, compare.

Its commands run exactly as written, in a fresh folder beside a link to the checkout's bench/ (the doc's
commands run from the repository's folder), except that the stand-in server's port 8000 becomes a free
one; `cmd &` runs in the background as a shell's job and `kill %1` stops it, as in the README's tour."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.test_readme_tour import OUTPUT, SETUP, UserShell, commands_of, on_port

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "validation.md"
SECTION = "## From your own server: record, calibrate, simulate, compare"


def walkthrough_commands() -> list[str]:
    text = DOC.read_text()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ", 5)] if "\n## " in section[5:] else section
    return commands_of(section)


def test_the_walkthrough_is_what_the_slow_test_runs():
    commands = walkthrough_commands()
    assert commands[:2] == [*SETUP, "mkdir -p scratch"]
    verbs = [c.split()[1] for c in commands if c.startswith("kvemu ")]
    assert verbs == ["calibrate", "replica", "gen", "replay", "sim", "compare"]
    # one job in the background, stopped at the end; every output under scratch/, which git ignores
    assert [c for c in commands if c.endswith(" &")] == [next(c for c in commands if c.startswith("kvemu replica"))]
    assert commands[-1] == "kill %1"
    outputs = [o for c in commands for o in re.findall(OUTPUT, c)]
    assert outputs and all(o.startswith("scratch/") for o in outputs), outputs
    # the recorded run and the prediction are of the same file, on the same device
    replay = next(c for c in commands if c.startswith("kvemu replay"))
    sim = next(c for c in commands if c.startswith("kvemu sim"))
    assert "--trace scratch/workload.jsonl" in replay and "--trace scratch/workload.jsonl" in sim
    assert "--requests-out scratch/measured.jsonl" in replay and "--requests-out scratch/predicted.jsonl" in sim
    assert "--gpu-file scratch/rtx4090.json" in sim


@pytest.mark.slow
def test_the_walkthrough_runs_as_written(tmp_path):
    shell = UserShell(tmp_path, timeout=120)
    port = str(free_port())
    (tmp_path / "bench").symlink_to(REPO / "bench")
    try:
        for cmd in walkthrough_commands():
            if cmd not in SETUP:
                shell.run(on_port(cmd, port))
        assert shell.jobs and all(p.returncode is not None for p in shell.jobs)
    finally:
        shell.stop_jobs()
    out = json.loads((tmp_path / "scratch" / "compare.json").read_text())
    # kvemu gen's 5 s of the single preset at 2 a second, seed 1: 8 requests, every one answered whole
    assert out["measured"]["requests"] == out["measured"]["finished"] == 8
    assert out["predicted"]["requests"] == out["predicted"]["finished"] == 8
    # the stand-in is the simulated device served live: its decode steps take the simulator's time (the
    # live side adds HTTP and event-loop time, most of it to the first token)
    figures = out["figures"]
    assert abs(figures["tpot_mean_s"]["rel_error"]) < 0.05, figures["tpot_mean_s"]
    assert abs(figures["e2e_mean_s"]["rel_error"]) < 0.10, figures["e2e_mean_s"]
    assert (tmp_path / "scratch" / "compare.png").stat().st_size > 0
