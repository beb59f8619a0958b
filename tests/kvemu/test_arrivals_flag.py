"""``--arrivals`` on ``kvemu sim``: a trace whose requests wait for others runs its dependent arrivals by default (the
simulator's clock computes them, as ``kvemu replay`` does live) and its recorded ones when asked."""

from __future__ import annotations

import argparse

from kvemu.cli import main
from kvemu.options.arrivals import add_arrivals_arg, arrivals_mode
from loadgen.formats import write_kvemu
from loadgen.request_metrics import read_requests
from loadgen.trace import Trace
from tests.support.agent_trace import AGENT

SIM = ["sim", "--capacity-blocks", "100", "--quiet"]


def test_the_default_is_dependent_only_where_the_trace_has_dependencies():
    p = argparse.ArgumentParser()
    add_arrivals_arg(p)
    assert [arrivals_mode(p.parse_args([]), deps) for deps in (True, False)] == ["dependent", "recorded"]
    assert arrivals_mode(p.parse_args(["--arrivals", "recorded"]), True) == "recorded"


def test_sim_computes_dependent_arrivals_by_default_and_keeps_the_trace_times_when_asked(tmp_path):
    trace, out = tmp_path / "agent.jsonl", tmp_path / "requests.jsonl"
    write_kvemu(Trace(sorted(AGENT, key=lambda r: r.t), 16, "hand-made"), trace)
    arrivals = {}
    for mode in ("dependent", "recorded"):
        assert main([*SIM, "--trace", str(trace), "--arrivals", mode, "--requests-out", str(out)]) == 0
        arrivals[mode] = [r.arrival_s for r in read_requests(out)]
    assert main([*SIM, "--trace", str(trace), "--requests-out", str(out)]) == 0  # the default where `after` is
    assert [r.arrival_s for r in read_requests(out)] == arrivals["dependent"]
    assert arrivals["recorded"] == sorted(r.t for r in AGENT)
    assert max(arrivals["dependent"]) < 9.0  # --requests-out gives the computed arrival
