"""A replay whose cluster goes away stops, and says why in one line; its progress line names the causes
of its failures as they happen."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import time

import pytest

from loadgen.replay import Progress, Replayer, Unreachable
from loadgen.trace import Trace, TraceRequest
from tests.conftest import free_port
from tests.support.kvemu_cli import REPO, kvemu_cmd
from tests.support.procs import start_replica


def test_the_progress_line_counts_failures_by_cause(capsys):
    progress = Progress(4, enabled=True)
    for cause in ("cannot connect", "", "HTTP 503", "cannot connect"):
        progress.tick(cause)
    progress.close()
    assert capsys.readouterr().err.rstrip().endswith("failed 3 (cannot connect 2, HTTP 503 1), on schedule")


def test_no_request_connecting_for_the_give_up_time_stops_the_replay():
    """Three sessions, a second apart, against a port nothing listens on, giving up after half a second:
    the second request is the first sent half a second after the first failure, so the replay stops
    there, and the third is never sent."""
    reqs = [TraceRequest(float(i), f"s{i}", 0, [i], 16, 1) for i in range(3)]
    url = f"http://127.0.0.1:{free_port()}"
    replayer = Replayer(url, Trace(reqs, block_size=16), speedup=1.0, progress=False, give_up_s=0.5)
    with pytest.raises(Unreachable) as gone:
        asyncio.run(replayer.run())
    assert [(r.session, r.status) for r in replayer.records] == [("s0", 0), ("s1", 0)]
    assert gone.value.seconds >= 0.9  # from the first failure to the second request's, a second of trace time later
    assert gone.value.cause.startswith("ClientConnectorError: Cannot connect to host 127.0.0.1:")


@pytest.mark.slow  # a replica process killed under a kvemu replay process: about 4 s
def test_a_cluster_killed_under_a_replay_stops_it_with_one_line(tmp_path):
    rep = start_replica(capacity_blocks=2000)
    out = tmp_path / "run.json"
    replay = subprocess.Popen(kvemu_cmd("replay", "--url", rep.url, "--workload", "chat", "--set", "session_rate=20",
                                        "--duration", "60", "--give-up-after", "1", "--json", str(out)),
                              cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)
        rep.stop(signal.SIGKILL)
        killed = time.monotonic()
        stdout, stderr = replay.communicate(timeout=30)
    finally:
        rep.stop()
        if replay.poll() is None:
            replay.kill()
    assert time.monotonic() - killed < 10  # a second of failures, then the report
    assert replay.returncode == 1, stderr[-2000:]
    doc = json.loads(out.read_text())
    done, total = len(doc["records"]), doc["summary"]["requests"]
    assert done == total and doc["summary"]["failed"] >= 1 and doc["summary"]["ok"] >= 1
    assert doc["summary"]["stopped"].startswith("no request could connect for 1.")
    last = stderr.strip().splitlines()[-1]
    assert re.fullmatch(rf"replay: stopped after {done:,} of [\d,]+ requests: none could connect to {rep.url} for"
                        rf" 1 s \(ClientConnectorError: Cannot connect to host 127\.0\.0\.1:{rep.port} .*\); is the"
                        rf" cluster still up\? The report covers those {done:,}; records and summary in {out}", last), last
    assert stdout.startswith(f"requests        {done:,} (")
