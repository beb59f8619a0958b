"""kvemu up's supervision (kvemu/up_supervise.py) on real, tiny child processes and a clock the test
moves: the back-off, its reset after a stable run, and giving up on a child that cannot start.
(tests/kvemu/test_up.py runs it inside `kvemu up` against replicas, the pool and the router.)"""

from __future__ import annotations

import io
import signal
import sys

import pytest

from kvemu.up import Child, Cluster
from kvemu.up_supervise import RestartPolicy, Supervisor, exit_text
from shared.errors import InputError
from tests.conftest import free_port


def test_the_backoff_doubles_from_half_a_second_to_ten():
    assert [RestartPolicy().backoff(n) for n in range(1, 8)] == [0.5, 1, 2, 4, 8, 10, 10]
    with pytest.raises(InputError) as err:
        RestartPolicy(attempts=-1)
    assert err.value.field == "--restart-attempts"
    assert exit_text(-9) == "code -9 (SIGKILL)" and exit_text(2) == "code 2"


def _start(tmp_path, code: str, url: str = "") -> tuple[Cluster, Child, io.StringIO]:
    cluster = Cluster(tmpdir=str(tmp_path))
    child = Child("replica-9", [sys.executable, "-c", code], url)
    cluster.start(child, str(tmp_path))
    err = io.StringIO()
    return cluster, child, err


def test_a_child_that_keeps_dying_before_it_answers_is_given_up_naming_its_last_log_line(tmp_path):
    # it never listens: its /health is a closed port, so no restart of it ever answers
    cluster, child, err = _start(tmp_path, "print('error: no GPU here', flush=True); raise SystemExit(3)",
                                 f"http://127.0.0.1:{free_port()}")
    sup = Supervisor(cluster, RestartPolicy(attempts=2), err=err)
    child.proc.wait(10)
    assert sup.step(0.0) is None  # it had answered at start-up: a plain restart, no failed start yet
    first = child.proc
    assert sup.step(0.4) is None and child.proc is first  # 0.5 s back-off
    assert sup.step(0.5) is None and child.proc is not first  # started again, same command line
    child.proc.wait(10)
    assert sup.step(1.0) is None  # failed start 1 of 2: 1 s back-off
    assert sup.step(2.0) is None
    child.proc.wait(10)
    refusal = sup.step(3.0)
    assert refusal == "replica-9 cannot start: it exited 2 times in a row before answering (last with code 3): no GPU here"
    assert err.getvalue().splitlines() == [
        "kvemu up: replica-9 exited with code 3; restarting it in 0.5 s (attempt 1)",
        "kvemu up: replica-9 exited with code 3; restarting it in 1 s (attempt 2)"]
    log = (tmp_path / "replica-9.log").read_text().splitlines()
    assert log == ["error: no GPU here", "--- kvemu up: replica-9 exited with code 3; restarting it in 0.5 s (attempt 1) ---",
                   "error: no GPU here", "--- kvemu up: replica-9 exited with code 3; restarting it in 1 s (attempt 2) ---",
                   "error: no GPU here"]


def test_the_backoff_starts_over_once_a_child_stayed_up_and_zero_attempts_never_restart(tmp_path):
    cluster, child, err = _start(tmp_path, "import time; time.sleep(60)")  # no URL, no port: it answers once running
    sup = Supervisor(cluster, RestartPolicy(attempts=3, stable_s=30.0), err=err)
    try:
        child.proc.send_signal(signal.SIGKILL)
        child.proc.wait(10)
        assert sup.step(0.0) is None and sup.step(0.5) is None  # restart 1, after 0.5 s
        assert sup.step(1.0) is None  # it runs and answers
        child.proc.send_signal(signal.SIGKILL)
        child.proc.wait(10)
        assert sup.step(5.0) is None  # died young: restart 2 waits 1 s
        assert sup.step(6.0) is None and sup.step(6.5) is None  # started, answered
        assert sup.step(36.5) is None  # up 30 s: the back-off starts over
        child.proc.send_signal(signal.SIGKILL)
        child.proc.wait(10)
        assert sup.step(37.0) is None
        assert [line.split("; ")[1] for line in err.getvalue().splitlines() if "exited" in line] == [
            "restarting it in 0.5 s (attempt 1)", "restarting it in 1 s (attempt 2)", "restarting it in 0.5 s (attempt 1)"]
        assert sum("is back" in line for line in err.getvalue().splitlines()) == 2
        never = Supervisor(cluster, RestartPolicy(attempts=0), err=err)
        assert never.step(100.0) == "replica-9 exited with code -9 (SIGKILL)"  # the child is still dead
    finally:
        cluster.stop(grace=1.0)
