"""``--arrivals`` on ``kvemu sim``: a trace whose requests wait for others runs its recorded arrivals when asked, and
is refused in one line while the simulator's clock does not compute dependent ones (``kvemu replay`` does)."""

from __future__ import annotations

import argparse

from kvemu.cli import main
from kvemu.options.arrivals import add_arrivals_arg, arrivals_mode
from loadgen.formats import write_kvemu
from loadgen.trace import Trace
from tests.loadgen.test_replay_dependent import AGENT

SIM = ["sim", "--capacity-blocks", "100", "--quiet"]


def test_the_default_is_dependent_only_where_the_trace_has_dependencies():
    p = argparse.ArgumentParser()
    add_arrivals_arg(p)
    assert [arrivals_mode(p.parse_args([]), deps) for deps in (True, False)] == ["dependent", "recorded"]
    assert arrivals_mode(p.parse_args(["--arrivals", "recorded"]), True) == "recorded"


def test_sim_runs_an_agent_trace_at_its_recorded_times_and_refuses_dependent_arrivals(tmp_path, capsys):
    trace = tmp_path / "agent.jsonl"
    write_kvemu(Trace(sorted(AGENT, key=lambda r: r.t), 16, "hand-made"), trace)
    assert main([*SIM, "--trace", str(trace)]) == 2
    err = capsys.readouterr().err
    assert "--arrivals: agent.jsonl's requests wait for others (`after`)" in err and "Traceback" not in err
    assert main([*SIM, "--trace", str(trace), "--arrivals", "recorded"]) == 0
