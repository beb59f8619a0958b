"""`kvemu sweep --dask ADDRESS`: the grid on a real Dask cluster (a LocalCluster of worker processes)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvemu.cli import main
from replica.core.build import EngineKnobs
from tests.support.procs import as_from_a_terminal

distributed = pytest.importorskip("distributed")

GRID = ["--policy", "lru,s3fifo", "--capacity-blocks", "600,2000", "--routing", "cache_aware,session",
        "--replicas", "1,2", "--quiet"]
# 2 policies x 2 capacities x (1 replica, whatever the routing + 2 replicas x 2 routings)
POINTS = 12


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=":0") as c:
        yield c


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def by_id_without_wall(path: Path) -> dict[str, str]:
    return {r["id"]: json.dumps({k: v for k, v in r.items() if k != "wall_s"}, sort_keys=True) for r in lines(path)}


def sweep(trace_file: Path, out: Path, *extra: str) -> int:
    return main(["sweep", "--trace", str(trace_file), *GRID, "--out", str(out), *extra])


def test_dask_records_equal_the_process_pool_records(cluster, trace_file, tmp_path, capsys):
    local, remote = tmp_path / "local.jsonl", tmp_path / "dask.jsonl"
    assert sweep(trace_file, local, "--jobs", "2") == 0
    assert sweep(trace_file, remote, "--dask", cluster.scheduler_address) == 0
    assert len(lines(remote)) == POINTS
    assert by_id_without_wall(remote) == by_id_without_wall(local)
    out = capsys.readouterr().out.splitlines()
    half = 1 + POINTS + 3  # the header, the points, the legend
    assert len(out) == 2 * half  # the same table (wall_s aside) from both
    assert [line.rsplit(None, 1)[0] for line in out[:half]] == [line.rsplit(None, 1)[0] for line in out[half:]]


def test_resume_on_dask_runs_only_the_missing_points(cluster, trace_file, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    assert sweep(trace_file, out, "--dask", cluster.scheduler_address) == 0
    text = out.read_text().splitlines(keepends=True)
    gone = {json.loads(text[2])["id"], json.loads(text[9])["id"]}
    out.write_text("".join(t for i, t in enumerate(text) if i not in (2, 9)))
    capsys.readouterr()
    argv = ["sweep", "--trace", str(trace_file), *GRID[:-1], "--out", str(out), "--resume",
            "--dask", cluster.scheduler_address]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert f"{POINTS - 2} already in {out}; running 2 on the Dask cluster at {cluster.scheduler_address} (2 worker(s), 2 thread(s))" in err
    assert {r["id"] for r in lines(out)[-2:]} == gone and len(lines(out)) == POINTS


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_scheduler_is_one_error_line(trace_file, tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    address = f"tcp://127.0.0.1:{free_port()}"
    assert sweep(trace_file, out, "--dask", address, "--dask-timeout", "1") == 2
    err = capsys.readouterr().err
    assert err == f"error: --dask: cannot reach a Dask scheduler at {address}: Timed out trying to connect to {address} after 1 s\n"
    assert not out.exists()


def test_bad_address_and_timeout_are_one_error_line(trace_file, tmp_path, capsys):
    assert sweep(trace_file, tmp_path / "r.jsonl", "--dask", "udp://127.0.0.1:8786") == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --dask: cannot reach a Dask scheduler at udp://127.0.0.1:8786: unknown address scheme")
    assert err.count("\n") == 1
    assert sweep(trace_file, tmp_path / "r.jsonl", "--dask", "tcp://127.0.0.1:1", "--dask-timeout", "0") == 2
    assert capsys.readouterr().err == "error: --dask-timeout: must be a number > 0, got 0.0\n"


def test_a_scheduler_without_workers_is_one_error_line(trace_file, tmp_path, capsys):
    with distributed.LocalCluster(n_workers=0, processes=True, host="127.0.0.1", dashboard_address=":0") as empty:
        address = empty.scheduler_address
        assert sweep(trace_file, tmp_path / "r.jsonl", "--dask", address, "--dask-timeout", "0.5") == 2
    assert capsys.readouterr().err == f"error: --dask: no worker joined the scheduler at {address} within 0.5 s\n"
    assert not (tmp_path / "r.jsonl").exists()


def test_dask_not_installed_is_one_error_line(trace_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # what `import distributed` sees without the package
    assert sweep(trace_file, tmp_path / "r.jsonl", "--dask", "tcp://127.0.0.1:8786") == 2
    err = capsys.readouterr().err
    assert err == ("error: --dask: needs Dask distributed, which is not installed: pip install 'kvemu[dask]'\n")


def test_the_trace_is_scattered_to_every_worker_once_and_dropped_after(cluster, trace_file):
    from loadgen.formats import read_trace
    from sim.dask_cells import DaskRunner
    from sim.simulator import SimSettings

    runner = DaskRunner.connect(cluster.scheduler_address, 10)
    try:
        holders: list[dict] = []

        def on_done(index: int, run: dict) -> None:
            holders.append({k: set(v) for k, v in runner.client.who_has().items() if k.startswith("Trace-")})

        cells = [SimSettings(capacity_blocks=c, reuse="off") for c in (600, 800, 1000)]
        runner.run(read_trace(trace_file), cells, on_done)
        workers = set(runner.client.scheduler_info()["workers"])
        assert len(holders) == 3 and len(workers) == 2
        # one trace object for the whole run (never re-scattered per cell), held by the workers;
        # who_has can lag a replica by a moment, so both workers must show up across the cells
        assert all(len(h) == 1 for h in holders) and len({k for h in holders for k in h}) == 1
        assert set().union(*(v for h in holders for v in h.values())) == workers
        # released after the run: the scheduler forgets it a moment after the client lets go (asynchronous)
        deadline = time.monotonic() + 10
        while [k for k in runner.client.who_has() if k.startswith("Trace-")] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [k for k in runner.client.who_has() if k.startswith("Trace-")]
    finally:
        runner.close()


def test_ctrl_c_cancels_the_cluster_tasks_and_keeps_finished_points(cluster, trace_file, tmp_path):
    out = tmp_path / "r.jsonl"
    argv = [sys.executable, "-m", "kvemu", "sweep", "--trace", str(trace_file), *GRID[:-1], "--out", str(out),
            "--dask", cluster.scheduler_address]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=as_from_a_terminal)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (out.exists() and out.read_text().count("\n") >= 1):
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: the sweep's process group (not the cluster's)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "rerun with --resume" in err
    done = len(lines(out))
    assert 1 <= done < POINTS
    with distributed.Client(cluster.scheduler_address, set_as_default=False) as client:
        left = client.run_on_scheduler(lambda dask_scheduler: [k for k in dask_scheduler.tasks if "kvemu" in str(k)])
    assert left == []  # every cell task was cancelled, none waits for a client that is gone
    assert main([*argv[3:], "--resume", "--quiet"]) == 0
    assert len(lines(out)) == POINTS


def test_a_failing_cell_on_a_worker_is_a_cell_error_with_its_index(cluster):
    from loadgen.trace import Trace, TraceRequest
    from sim.cells import CellError
    from sim.dask_cells import DaskRunner
    from sim.simulator import SimSettings

    # a policy parameter LRU does not take: the simulator raises on the worker (a request the pool
    # could never hold is refused, never an error)
    trace = Trace([TraceRequest(0.0, "s", 0, list(range(10)), 160, 1)], block_size=16)
    cells = [SimSettings(capacity_blocks=20), SimSettings(capacity_blocks=5,
                                                          knobs=EngineKnobs(policy_params=(("bogus", 1),)))]
    runner = DaskRunner.connect(cluster.scheduler_address, 10)
    try:
        with pytest.raises(CellError) as err:
            runner.run(trace, cells, lambda index, run: None)
    finally:
        runner.close()
    assert err.value.index == 1
    assert type(err.value.error).__name__ == "InputError"


def test_losing_the_scheduler_mid_sweep_is_one_error_line_and_keeps_finished_points(trace_file, tmp_path):
    out = tmp_path / "r.jsonl"
    lost = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                    dashboard_address=":0")
    address = lost.scheduler_address
    argv = [sys.executable, "-m", "kvemu", "sweep", "--trace", str(trace_file), *GRID, "--out", str(out),
            "--dask", address, "--max-model-len", "9600"]  # what 600 blocks hold: no start-up warning
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=as_from_a_terminal)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (out.exists() and out.read_text().count("\n") >= 1):
            time.sleep(0.02)
    finally:
        lost.close()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    # the cause depends on which call first saw the scheduler go (a cancelled future or a closed comm)
    assert err.startswith(f"error: lost the Dask scheduler at {address} (") and err.count("\n") == 1
    assert err.endswith("); finished points are saved, rerun with --resume\n")
    assert 1 <= len(lines(out)) < POINTS
