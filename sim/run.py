"""``simulate``: one run of a trace in virtual time, on the simulator that fits the cluster: colocated
replicas (sim/simulator.py) or prefill and decode pools beside them (sim/pd.py)."""

from __future__ import annotations

from loadgen.trace import Trace
from shared.gc_tuning import gc_paused
from sim.pd import PdSimulation
from sim.settings import SimSettings
from sim.simulator import Simulation


def simulate(trace: Trace, settings: SimSettings, progress=None, records: bool = False) -> dict:
    """The run's report; ``records``: with each request's results under ``request_records``
    (``loadgen.request_metrics.RequestRecord``, one per request of ``trace``, in its order)."""
    with gc_paused():  # the trace is built: the collector would find nothing to free in the loop
        sim = PdSimulation(trace, settings, progress) if settings.pd is not None else Simulation(trace, settings, progress)
        run = sim.run()
        if records:
            run["request_records"] = sim.request_records()
        return run
