"""Issue 17, item 10: what a user can type is one error line, never a traceback."""

import pytest

from tests.support.kvemu_cli import run_kvemu


def _error_line(*args: str) -> str:
    out = run_kvemu(*args, timeout=60)
    assert out.returncode == 2, out.stderr[-500:]
    assert "Traceback" not in out.stderr
    return out.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_capacity_gib_must_be_finite(value):
    assert _error_line("replica", "--capacity-gib", value) == \
        f"error: capacity_gib: must be a finite number > 0, got {value}"
    assert _error_line("up", "--capacity-gib", value) == \
        f"error: --capacity-gib: must be a finite number > 0, got {value}"
    assert _error_line("sim", "--workload", "chat", "--duration", "5", "--capacity-gib", value) == \
        f"error: --capacity-gib: must be a finite positive number, got {value}"


def test_sim_names_and_replicas_are_checked_before_capacity():
    line = _error_line("sim", "--workload", "chat", "--duration", "5", "--capacity-gib", "0.00001", "--policy", "nope")
    assert line.startswith("error: unknown policy 'nope'; valid: ")
    assert _error_line("sim", "--workload", "chat", "--duration", "5", "--capacity-gib", "0.00001",
                       "--replicas", "0") == "error: --replicas: must be a positive integer, got 0"
