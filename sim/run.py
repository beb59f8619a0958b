"""``simulate``: one run of a trace in virtual time, on the simulator that fits the cluster: colocated
replicas or prefill and decode pools beside them (sim/simulator.py, whose loop calls sim/pd.py's component
for P/D), or instances of DP ranks (sim/dp.py)."""

from __future__ import annotations

from loadgen.trace import Trace
from shared.gc_tuning import gc_paused
from sim.dp import DpSimulation
from sim.settings import SimSettings
from sim.simulator import Simulation


def simulate(trace: Trace, settings: SimSettings, progress=None, records: bool = False) -> dict:
    """The run's report; ``records``: with each request's results under ``request_records``
    (``loadgen.request_metrics.RequestRecord``, one per request of ``trace``, in its order)."""
    with gc_paused():  # the trace is built: the collector would find nothing to free in the loop
        if settings.data_parallel_size > 1:
            sim: Simulation = DpSimulation(trace, settings, progress)
        else:
            sim = Simulation(trace, settings, progress)
        run = sim.run()
        if records:
            run["request_records"] = sim.request_records()
        return run
