"""``kvemu replay`` with dependent arrivals: the hand-worked agent trace (turn 2 a gap after turn 1; a fan-out of
three joined by a fourth) against a real replica, each computed arrival the finish of what it waits for plus its
gap; and a request whose dependency failed, never sent and counted as failed."""

from __future__ import annotations

import asyncio

import pytest

from kvemu.cli import main
from loadgen.formats import write_kvemu
from loadgen.replay import DEPENDENCY_FAILED, Replayer, failure
from loadgen.request_metrics import read_requests
from loadgen.trace import Trace
from tests.conftest import free_port
from tests.support.agent_trace import AGENT, due, req
from tests.support.procs import start_replica

SPEEDUP = 10.0  # trace seconds per second of the replay: a gap_s of 1.0 waits 0.1 s


def test_each_arrival_is_the_finish_of_what_it_waits_for_plus_its_gap(tmp_path, capsys):
    trace = tmp_path / "agent.jsonl"
    write_kvemu(Trace(AGENT, 16, "hand-made"), trace)
    out = tmp_path / "requests.jsonl"
    replica = start_replica(replica_id="r-1")
    try:
        assert main(["replay", "--url", replica.url, "--trace", str(trace), "--speedup", str(SPEEDUP),
                     "--requests-out", str(out), "--quiet"]) == 0
    finally:
        replica.stop()
    recs = {AGENT[r.index].id: r for r in read_requests(out)}
    assert recs["t1"].arrival_s == 0.0 and recs["p"].arrival_s == pytest.approx(0.2 / SPEEDUP)  # at their t
    finish = {name: r.finish_s for name, r in recs.items()}
    expected = due(finish, 1 / SPEEDUP)
    assert sorted(expected) == ["c1", "c2", "c3", "j", "t2"]
    for name, at in expected.items():
        # the replay notes a finish as it reads the last chunk, a moment after the chunk's own time
        assert 0.0 <= recs[name].arrival_s - at < 0.05, name
        assert recs[name].arrival_s < 9.0 / SPEEDUP  # none waited for its recorded time


def test_a_request_whose_dependency_failed_is_never_sent_and_counts_as_failed():
    reqs = [req("p", 0.0, 0), req("c", 0.0, 1, ["p"]), req("j", 0.0, 2, ["c"]), req("x", 0.0, 0, session="other")]
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens: every request sent fails to connect
    replayer = Replayer(url, Trace(reqs, 16), speedup=1.0, progress=False, give_up_s=0, dependent=True)
    records = asyncio.run(replayer.run())
    causes = {(r.session, r.turn): failure(r) for r in records}
    assert causes == {("agent", 0): "cannot connect", ("agent", 1): DEPENDENCY_FAILED, ("agent", 2): DEPENDENCY_FAILED,
                      ("other", 0): "cannot connect"}
    assert all(r.status == 0 for r in records)
