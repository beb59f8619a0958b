"""Simulator cells on an existing Dask distributed cluster (``kvemu sweep --dask ADDRESS``).

The trace is scattered to every worker once (``broadcast=True``) and each cell is one task,
``sim.cells.run_cell(trace, settings)``, that takes the scattered trace by reference, so only
the small settings travel per cell. Results come back through ``as_completed`` in finishing
order, the same loop as the local process pool. On any exception (Ctrl-C included) the
cell tasks are cancelled; a cell already running on a worker finishes there and its result is
dropped, since Dask does not interrupt a running task.

Workers need kvemu installed (the same version as here): ``connect`` checks that before any
work, and waits up to its timeout for at least one worker to join.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import logging
import uuid
from collections.abc import Sequence
from typing import Any

from loadgen.trace import Trace
from shared.errors import InputError
from sim.cells import CellError, LocalPool, OnDone, Runner, RunnerLost, run_cell
from sim.simulator import SimSettings

INSTALL = "pip install 'kvemu[dask]'"


def _kvemu_version() -> str:
    try:
        return importlib.metadata.version("kvemu")
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _quiet_client_log() -> None:
    """Only critical records from ``distributed`` in this process (its config gives some of its
    loggers, e.g. ``distributed.client``, levels of their own, so each one is set)."""
    names = [n for n in logging.root.manager.loggerDict if n == "distributed" or n.startswith("distributed.")]
    for name in ["distributed", *names]:
        logging.getLogger(name).setLevel(logging.CRITICAL)


class DaskRunner:
    def __init__(self, client: Any, address: str) -> None:
        self.client, self.address = client, address

    @classmethod
    def connect(cls, address: str, timeout_s: float) -> DaskRunner:
        """A client of the scheduler at ``address``, with at least one worker that runs this kvemu."""
        try:
            from distributed import Client
        except ImportError:
            raise InputError("--dask", f"needs Dask distributed, which is not installed: {INSTALL}") from None
        # The sweep reports what goes wrong in one line; the client's own log (reconnect attempts
        # and their tracebacks when the scheduler goes away) would bury it.
        _quiet_client_log()
        try:
            client = Client(address, timeout=timeout_s, set_as_default=False)
        except (OSError, ValueError) as exc:
            raise InputError("--dask", f"cannot reach a Dask scheduler at {address}: {exc}") from None
        try:
            cls._check_workers(client, address, timeout_s)
        except BaseException:
            client.close()
            raise
        return cls(client, address)

    @staticmethod
    def _check_workers(client: Any, address: str, timeout_s: float) -> None:
        try:
            client.wait_for_workers(1, timeout=timeout_s)
        except TimeoutError:
            raise InputError("--dask", f"no worker joined the scheduler at {address} within {timeout_s:g} s") from None
        # The version as a worker's interpreter sees it; a stdlib function, so it pickles by reference.
        versions = client.run(importlib.metadata.version, "kvemu", on_error="return")
        mine = _kvemu_version()
        for worker, version in sorted(versions.items()):
            if isinstance(version, BaseException):
                raise InputError("--dask", f"worker {worker} cannot import kvemu; install it on every worker: {INSTALL}")
            if version != mine:
                raise InputError("--dask", f"worker {worker} runs kvemu {version}, this is {mine}; install the same on every worker")

    def where(self, cells: int) -> str:
        info = self.client.scheduler_info()
        workers = info.get("workers", {})
        threads = sum(w.get("nthreads", 0) for w in workers.values())
        return f"the Dask cluster at {self.address} ({len(workers)} worker(s), {threads} thread(s))"

    def run(self, trace: Trace, cells: Sequence[SimSettings], on_done: OnDone) -> None:
        if not cells:
            return
        from distributed import as_completed
        from distributed.client import FutureCancelledError
        from distributed.comm.core import CommClosedError

        client = self.client
        tag = uuid.uuid4().hex[:8]
        futures = []
        shared = client.scatter(trace, broadcast=True, hash=False)
        try:
            futures = [client.submit(run_cell, shared, s, key=f"kvemu-cell-{tag}-{i}", pure=False)
                       for i, s in enumerate(cells)]
            index = {fut.key: i for i, fut in enumerate(futures)}
            for fut in as_completed(futures, loop=client.loop):
                i = index[fut.key]
                try:
                    result = fut.result()
                except Exception as exc:
                    if isinstance(exc, (FutureCancelledError, CommClosedError)) or client.status != "running":
                        # not the cell's fault: the scheduler went away (or cancelled the cells)
                        raise RunnerLost(f"lost the Dask scheduler at {self.address} ({exc!r:.200})") from None
                    raise CellError(i, exc) from exc
                on_done(i, result)
        except BaseException:
            _forget(client, futures)
            raise
        finally:
            _forget(client, [shared])  # the workers drop their copy of the trace

    def close(self) -> None:
        self.client.close()


def _forget(client: Any, futures: list) -> None:
    """Cancel ``futures`` on the cluster; with the scheduler gone there is nothing to cancel, and
    the error that brought us here is the one to report."""
    with contextlib.suppress(Exception):
        client.cancel(futures, force=True)


def open_runner(jobs: int, dask: str | None = None, timeout_s: float = 10.0) -> Runner:
    """The Dask cluster at ``dask`` when given (connected now, so a bad address fails before any
    work), else a local pool of ``jobs`` processes. Close it when done."""
    if dask:
        return DaskRunner.connect(dask, timeout_s)
    return LocalPool(jobs)
