"""The README's short tour, then the full tour (docs/tour.md), as a user who finished the Quickstart types them.

Every command of both tours' code blocks runs with this virtualenv's `kvemu` on PATH (what
`source .venv/bin/activate` gives) in a fresh folder, exactly as written, except that the
live cluster's port 8000 becomes a free port (other test runs may hold 8000 on this host).
The README's tour runs first, top to bottom; then the full tour's commands that the README's did
not already run, top to bottom, in the same folder (the README's tour is a short path through the
full one: each of its commands is one of the full tour's, so none runs twice). `kvemu up` runs in
the background as in a first terminal, the commands after it run as in a second one, and Ctrl-C
(SIGINT) stops it. The tours' outputs land in `scratch/`, which `.gitignore` covers.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import free_port

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
TOUR = REPO / "docs" / "tour.md"
SETUP = ("source .venv/bin/activate",)  # done: this venv, whose dev extra has the Quickstart's plot extra
JOBS = re.compile(r"kill( %\d+)+")  # `kill %1 %2`: the tour stops the background jobs it started, by job number
OUTPUT = r"(?:-o|--json|--csv|--plot|--out) ([^\s-]\S*)"


def commands_of(text: str) -> list[str]:
    """The commands of a page's code blocks: continuation lines joined, comments dropped."""
    commands = []
    for block in re.findall(r"```\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(re.sub(r"\s+", " ", line))
    return commands


def tour_commands() -> list[str]:
    """The README's short tour: its section, up to the next heading of its level."""
    text = README.read_text()
    tour = text[text.index("## A short tour"):]
    tour = tour[:tour.index("\n## ", 5)] if "\n## " in tour[5:] else tour
    return commands_of(tour)


def full_tour_commands() -> list[str]:
    """docs/tour.md: every code block of the page."""
    return commands_of(TOUR.read_text())


def test_the_tours_are_what_this_test_runs():
    short, full = tour_commands(), full_tour_commands()
    for commands in (short, full):
        assert commands[:2] == [*SETUP, "mkdir -p scratch"]
        # the Quickstart installed kvemu with its plot extra: no tour builds it again
        assert not [c for c in commands if c.startswith("pip install") and " -e " in c]
        assert sum(c.startswith("kvemu up ") for c in commands) == 1
        # every output goes to scratch/, which git ignores
        outputs = [o for c in commands for o in re.findall(OUTPUT, c)]
        assert outputs and all(o.startswith("scratch/") for o in outputs), outputs
    assert "scratch/" in (REPO / ".gitignore").read_text().splitlines()
    # the short tour is a path through the full one: the same commands, the same cluster
    assert [c for c in short if c not in full] == []
    assert len(short) < len(full)


def test_the_commands_are_read_as_a_shell_reads_them():
    text = "x\n```\nkvemu sim --a 1 \\\n    --b scratch/o.json   # why\n# a note\n\ncurl -s u | head\n```\n"
    assert commands_of(text) == ["kvemu sim --a 1 --b scratch/o.json", "curl -s u | head"]


def on_port(cmd: str, port: str) -> str:
    """The cluster's port 8000 as `port`, wherever a command names it (never another 8000)."""
    return re.sub(r"(?<=127\.0\.0\.1:)8000\b|(?<=--port )8000\b", port, cmd)


def test_only_the_cluster_port_moves():
    cmd = "kvemu up --port 8000 && curl http://127.0.0.1:8000/x && kvemu sweep --capacity-blocks 2000,8000"
    assert on_port(cmd, "41234") == ("kvemu up --port 41234 && curl http://127.0.0.1:41234/x"
                                     " && kvemu sweep --capacity-blocks 2000,8000")


class UserShell:
    """A user's shell in ``cwd`` with this virtualenv's ``kvemu`` on PATH, running a doc's commands as typed:
    ``cmd &`` as a background job, ``kill %N`` stopping jobs by the number a shell gives them (from 1, in
    the order they started), any other command to its end, which must succeed without a traceback."""

    def __init__(self, cwd: Path, timeout: float) -> None:
        self.cwd, self.timeout = cwd, timeout
        self.env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        self.jobs: list[subprocess.Popen] = []

    def run(self, cmd: str) -> None:
        if JOBS.fullmatch(cmd):
            for job in re.findall(r"%(\d+)", cmd):
                stop_job(self.jobs[int(job) - 1])
        elif cmd.endswith(" &"):
            self.jobs.append(subprocess.Popen(["bash", "-c", "exec " + cmd[:-2]], cwd=self.cwd, env=self.env,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        else:
            proc = subprocess.run(["bash", "-c", cmd], cwd=self.cwd, env=self.env, capture_output=True, text=True,
                                  timeout=self.timeout)
            assert proc.returncode == 0, f"{cmd}\n{proc.stderr[-3000:]}"
            assert "Traceback" not in proc.stderr, cmd

    def stop_jobs(self) -> None:
        for proc in self.jobs:
            stop_job(proc)


@pytest.mark.slow
def test_the_tours_run_top_to_bottom(tmp_path):
    shell = UserShell(tmp_path, timeout=300)
    port = str(free_port())
    up = None
    (tmp_path / "deploy").symlink_to(REPO / "deploy")  # what a clone has beside the README
    try:
        short = tour_commands()
        for cmd in [*short, *(c for c in full_tour_commands() if c not in short)]:
            if cmd in SETUP:
                continue
            cmd = on_port(cmd, port)
            if cmd.startswith("kvemu up ") and not cmd.endswith(" &"):  # the first terminal
                up = subprocess.Popen(["bash", "-c", "exec " + cmd], cwd=tmp_path, env=shell.env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                wait_up(f"http://127.0.0.1:{port}", up)
            else:
                shell.run(cmd)
        # the tours stopped every job they started in the background (the README says how)
        assert shell.jobs and all(proc.returncode is not None for proc in shell.jobs)
    finally:
        shell.stop_jobs()
        if up is not None:
            up.send_signal(signal.SIGINT)  # Ctrl-C stops all
            _, err = up.communicate(timeout=60)
            assert up.returncode == 0, err[-2000:]
    assert all(proc.returncode is not None for proc in shell.jobs)
    made = sorted(p.name for p in (tmp_path / "scratch").iterdir())
    assert made == ["capacity.png", "out.json", "run.csv", "run.json", "run.png", "scm.jsonl", "sweep.csv",
                    "sweep.jsonl", "sweep.png"]


def stop_job(proc: subprocess.Popen) -> None:
    """What `kill %N` does to a job: SIGTERM (then SIGKILL for one that outlives 20 s)."""
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_up(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"kvemu up did not answer at {url}")
