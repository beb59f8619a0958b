"""What a user sees when something is wrong: one `error:` line saying what and what to do,
exit status 2, never a traceback; a failed `kvemu up` names the log folder it kept."""

import os
import re
import socket

import pytest

from tests.conftest import free_port
from tests.support.kvemu_cli import run_kvemu


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def one_error_line(proc) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_up_on_a_port_in_use(busy_port):
    line = one_error_line(run_kvemu("up", "--port", str(busy_port), "--replicas", "1"))
    assert line == f"error: --port: port {busy_port} on 127.0.0.1 is in use; pick another, or stop what listens there"


@pytest.mark.parametrize("cmd", [("replica", "--capacity-blocks", "100"), ("router", "--replicas", "http://127.0.0.1:9")])
def test_one_process_on_a_port_in_use(busy_port, cmd):
    proc = run_kvemu(*cmd, "--port", str(busy_port))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: port {busy_port} on 127.0.0.1 is in use; pick another with --port, or stop what listens there"]


def test_up_with_an_unreachable_redis():
    port = free_port()
    line = one_error_line(run_kvemu("up", "--port", "0", "--index", f"redis://127.0.0.1:{port}/0",
                                        "--capacity-blocks", "20000"))
    assert line.startswith(f"error: cannot reach Redis at redis://127.0.0.1:{port}/0 (")
    assert line.endswith("); start it, or use --index redis (a private redis-server) or --index memory")


def test_a_missing_trace_file():
    line = one_error_line(run_kvemu("sim", "--trace", "nope.jsonl", "--capacity-blocks", "100"))
    assert line == ("error: trace: no file nope.jsonl; give a trace file's path or a built-in trace name"
                    " (mooncake-conversation, mooncake-synthetic)")


@pytest.mark.parametrize("cmd", [("gen", "-o", "x.jsonl"), ("sim", "--capacity-blocks", "100")])
def test_an_unknown_workload_is_one_line_pointing_at_the_list(cmd):
    line = one_error_line(run_kvemu(*cmd, "--workload", "nope"))
    assert "'nope'" in line and "valid: agent, chat, freeinference, mix, scm, single" in line
    assert line.endswith("(`kvemu gen --list` shows their parameters)")


def test_up_lists_only_the_policies_a_live_replica_runs():
    line = one_error_line(run_kvemu("up", "--port", "0", "--policy", "belady"))
    assert line == ("error: unknown policy 'belady'; valid: adaptive, arc, lru, partial_node, random_compute, s3fifo,"
                    " session_lru (belady, belady_compute need the future and run in `kvemu sim` only)")


def test_a_failed_up_names_the_log_folder_it_kept():
    proc = run_kvemu("up", "--port", "0", "--replicas", "1", "--start-timeout", "0.01", "--capacity-blocks", "20000")
    line = one_error_line(proc)
    m = re.fullmatch(r"error: not healthy after 0 s: .+ \(logs kept in (\S+)\)", line)
    assert m, line
    folder = m.group(1)
    try:
        assert sorted(os.listdir(folder)) == ["replica-0.log", "router.log"]
    finally:
        for name in os.listdir(folder):
            os.remove(os.path.join(folder, name))
        os.rmdir(folder)
