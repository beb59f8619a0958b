"""Many simulator cells over one trace, each one ``simulate()`` call, run in parallel.

A cell is a ``SimSettings``. A runner computes a list of cells and calls ``on_done(index, run)``
in this process as each one finishes (in completion order), so its caller writes, counts and
prints results as they arrive. Any exception (a failed cell, Ctrl-C, an error raised by
``on_done``) stops the work still queued or running before it propagates; a failed cell
surfaces as ``CellError`` naming its index, a lost cluster as ``RunnerLost``.

Two runners share that contract: ``LocalPool`` (a ``ProcessPoolExecutor`` on this machine; the
trace reaches each worker once, through the pool's initializer) and ``sim.dask_cells.DaskRunner``
(an existing Dask distributed cluster; the trace is scattered to every worker once).
``sim.dask_cells.open_runner`` picks one. Cells are independent and deterministic, so every runner gives the
same runs as a serial loop over ``simulate()``, except the measured ``wall_s``.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Protocol

from loadgen.trace import Trace
from shared.errors import KvemuError
from sim.run import simulate
from sim.simulator import SimSettings

OnDone = Callable[[int, dict], None]


class CellError(KvemuError):
    """Cell ``index`` raised ``error`` in its worker."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(f"cell {index} failed: {error!r}")
        self.index = index
        self.error = error


class RunnerLost(KvemuError):
    """The runner lost what runs the cells (e.g. the Dask scheduler went away); no cell is to blame."""


class Runner(Protocol):
    def where(self, cells: int) -> str:
        """Where ``cells`` cells would run, for a progress line (e.g. "2 worker(s)")."""
        ...

    def run(self, trace: Trace, cells: Sequence[SimSettings], on_done: OnDone) -> None: ...

    def close(self) -> None: ...


def run_cell(trace: Trace, settings: SimSettings) -> dict:
    """One cell; what a Dask worker calls (module-level, so it pickles by reference)."""
    return simulate(trace, settings)


# ---------------------------------------------------------------- local process pool

_TRACE: Trace | None = None


def _init_worker(trace: Trace) -> None:
    """Runs once per worker: keep the trace; leave Ctrl-C to the parent, which stops us."""
    global _TRACE
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _TRACE = trace


def _run_local(settings: SimSettings) -> dict:
    assert _TRACE is not None  # _init_worker ran in this worker
    return simulate(_TRACE, settings)


def _stop(executor: ProcessPoolExecutor) -> None:
    """Cancel queued cells and end the running ones now (their work is lost)."""
    procs = list((getattr(executor, "_processes", None) or {}).values())  # shutdown() forgets them
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    for proc in procs:
        proc.join(timeout=5)
    executor.shutdown(wait=True, cancel_futures=True)


class LocalPool:
    """Up to ``jobs`` worker processes on this machine (never more than there are cells)."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs

    def where(self, cells: int) -> str:
        return f"{min(self.jobs, max(cells, 1))} worker(s)"

    def run(self, trace: Trace, cells: Sequence[SimSettings], on_done: OnDone) -> None:
        if not cells:
            return
        executor = ProcessPoolExecutor(max_workers=min(self.jobs, len(cells)), initializer=_init_worker,
                                       initargs=(trace,))
        try:
            pending: dict[Future, int] = {executor.submit(_run_local, s): i for i, s in enumerate(cells)}
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    index = pending.pop(fut)
                    try:
                        result = fut.result()
                    except Exception as exc:
                        raise CellError(index, exc) from exc
                    on_done(index, result)
        except BaseException:
            _stop(executor)
            raise
        executor.shutdown(wait=True)

    def close(self) -> None:
        pass
