"""The README's tour, top to bottom, as a user who finished the Quickstart types it.

Every command of the tour's code blocks runs with this virtualenv's `kvemu` on PATH (what
`source .venv/bin/activate` gives) in a fresh folder, exactly as written, except that the
live cluster's port 8000 becomes a free port (other test runs may hold 8000 on this host).
`kvemu up` runs in the background as in a first terminal, the commands after it run as in
a second one, and Ctrl-C (SIGINT) stops it. The tour's outputs land in `scratch/`, which
`.gitignore` covers.
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
SETUP = ("source .venv/bin/activate", "pip install -q -e '.[plot]'")  # done: this venv, dev extra


def tour_commands() -> list[str]:
    text = README.read_text()
    tour = text[text.index("## A short tour"):]
    tour = tour[:tour.index("\n## ", 5)] if "\n## " in tour[5:] else tour
    commands = []
    for block in re.findall(r"```\n(.*?)```", tour, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(re.sub(r"\s+", " ", line))
    return commands


def test_the_tour_is_what_this_test_runs():
    commands = tour_commands()
    assert commands[:3] == [*SETUP, "mkdir -p scratch"]
    assert sum(c.startswith("kvemu up ") for c in commands) == 1
    # every output goes to scratch/, which git ignores
    outputs = [o for c in commands for o in re.findall(r"(?:-o|--json|--csv|--plot|--out) ([^\s-]\S*)", c)]
    assert outputs and all(o.startswith("scratch/") for o in outputs), outputs
    assert "scratch/" in (REPO / ".gitignore").read_text().splitlines()


@pytest.mark.slow
def test_the_readme_tour_runs_top_to_bottom(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    port = str(free_port())
    up = None
    background: list[subprocess.Popen] = []  # `cmd &`, as a user's shell runs it: stopped at the end
    (tmp_path / "deploy").symlink_to(REPO / "deploy")  # what a clone has beside the README
    try:
        for cmd in tour_commands():
            if cmd in SETUP:
                continue
            cmd = cmd.replace("8000", port)
            if cmd.endswith(" &"):
                background.append(subprocess.Popen(["bash", "-c", "exec " + cmd[:-2]], cwd=tmp_path, env=env,
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
                continue
            if cmd.startswith("kvemu up "):
                up = subprocess.Popen(["bash", "-c", "exec " + cmd], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
                wait_up(f"http://127.0.0.1:{port}", up)
                continue
            proc = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=300)
            assert proc.returncode == 0, f"{cmd}\n{proc.stderr[-3000:]}"
            assert "Traceback" not in proc.stderr, cmd
    finally:
        for proc in background:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
        if up is not None:
            up.send_signal(signal.SIGINT)  # Ctrl-C stops all
            _, err = up.communicate(timeout=60)
            assert up.returncode == 0, err[-2000:]
    assert all(proc.returncode is not None for proc in background)
    made = sorted(p.name for p in (tmp_path / "scratch").iterdir())
    assert made == ["capacity.png", "out.json", "run.csv", "run.json", "run.png", "scm.jsonl", "sweep.csv",
                    "sweep.jsonl", "sweep.png"]


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
