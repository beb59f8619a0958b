"""``simulate``: one run of a trace in virtual time: colocated replicas, prefill and decode pools beside them or
instances of DP ranks, one ``Simulation`` (sim/simulator.py, whose loop calls sim/pd_flow.py's component for P/D and
sim/dp.py's for DP)."""

from __future__ import annotations

from loadgen.trace import Trace
from shared.gc_tuning import gc_paused
from sim.report import agent_paths
from sim.settings import SimSettings
from sim.simulator import Simulation


def simulate(trace: Trace, settings: SimSettings, progress=None, records: bool = False) -> dict:
    """The run's report; ``records``: with each request's results under ``request_records``
    (``loadgen.request_metrics.RequestRecord``, one per request of ``trace``, in its order) and, for a trace with
    dependencies, each agent session's task time and critical path under ``agent_paths``
    (``loadgen.critical_path.SessionPath`` rows as dicts)."""
    with gc_paused():  # the trace is built: the collector would find nothing to free in the loop
        sim = Simulation(trace, settings, progress)
        run = sim.run()
        if records:
            run["request_records"] = sim.request_records()
            if "agent_sessions" in run:
                run["agent_paths"] = [p._asdict() for p in agent_paths(sim)[0]]
        return run
