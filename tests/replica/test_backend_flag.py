"""``--backend torch`` where torch is not installed: one line saying how to install it."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_without_torch_the_torch_backend_says_how_to_install_it(tmp_path):
    shim = tmp_path / "shim" / "torch"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text("raise ImportError('no torch here')\n")
    env = {**os.environ, "PYTHONPATH": f"{shim.parent}{os.pathsep}{REPO}"}
    for cmd in (["-m", "kvemu", "replica"], ["-m", "kvemu", "up"]):  # up says it once, before starting anything
        proc = subprocess.run([sys.executable, *cmd, "--capacity-blocks", "10", "--backend", "torch"],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, (cmd, proc.stderr)
        assert proc.stderr == "error: backend: torch is not installed: pip install 'kvemu[torch]'\n", cmd
