"""`kvemu sim --jobs N`: policy x capacity cells in worker processes, the same runs as a serial loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvemu.cli import main
from loadgen.formats import read_trace
from loadgen.trace import Trace, TraceRequest
from replica.core.build import EngineKnobs
from sim.cells import CellError, LocalPool
from sim.run import simulate
from sim.simulator import SimSettings

CELLS = ["--policy", "lru,s3fifo", "--capacity-blocks", "600,1200,2400", "--quiet"]


def sim_runs(trace_file: Path, out: Path, *extra: str) -> list[dict]:
    assert main(["sim", "--trace", str(trace_file), *CELLS, *extra, "--json", str(out)]) == 0
    return json.loads(out.read_text())["runs"]


def without_wall(run: dict) -> str:
    return json.dumps({k: v for k, v in run.items() if k != "wall_s"}, sort_keys=True)


def test_parallel_cells_give_the_serial_runs_in_grid_order(trace_file, tmp_path, capsys):
    serial = sim_runs(trace_file, tmp_path / "serial.json", "--jobs", "1")
    parallel = sim_runs(trace_file, tmp_path / "parallel.json", "--jobs", "2")
    order = [(r["policy"], r["capacity_blocks"]) for r in parallel]
    assert order == [(p, c) for p in ("lru", "s3fifo") for c in (600, 1200, 2400)]
    assert [without_wall(r) for r in parallel] == [without_wall(r) for r in serial]
    assert all(r["requests"] == r["served"] == 740 for r in parallel)
    # and the table printed on stdout is the same
    out = capsys.readouterr().out.splitlines()
    n = 1 + 6 + 3  # the header, the six runs, the legend
    assert len(out) == 2 * n and out[:n] == out[n:]


def test_more_jobs_than_cells_and_a_single_cell(trace_file, tmp_path):
    runs = sim_runs(trace_file, tmp_path / "a.json", "--jobs", "16")
    assert len(runs) == 6
    one = ["sim", "--trace", str(trace_file), "--policy", "arc", "--capacity-blocks", "900", "--quiet", "--jobs", "4",
           "--json", str(tmp_path / "one.json")]
    assert main(one) == 0
    [run] = json.loads((tmp_path / "one.json").read_text())["runs"]
    direct = simulate(read_trace(trace_file), SimSettings(capacity_blocks=900, knobs=EngineKnobs(policy="arc")))
    assert without_wall(run) == without_wall(direct)


def test_progress_counts_cells_with_one_line_each(trace_file, tmp_path, capsys):
    argv = ["sim", "--trace", str(trace_file), "--policy", "lru", "--capacity-blocks", "600,2400", "--jobs", "2",
            "--no-reuse-distances"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "lru @ 600 blocks: block hit" in err and "lru @ 2,400 blocks: block hit" in err
    assert "sim on 2 worker(s)" in err and "2/2" in err


def test_jobs_below_one_is_one_error_line(trace_file, capsys):
    assert main(["sim", "--trace", str(trace_file), *CELLS, "--jobs", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --jobs: must be >= 1, got 0\n"


def test_an_error_in_the_callback_stops_the_pool_and_propagates(trace_file):
    trace = read_trace(trace_file)
    cells = [SimSettings(capacity_blocks=c, reuse="off") for c in (600, 700, 800, 900)]
    seen = []

    def on_done(index: int, run: dict) -> None:
        seen.append(index)
        raise RuntimeError("disk full")

    pool = LocalPool(2)
    with pytest.raises(RuntimeError, match="disk full"):
        pool.run(trace, cells, on_done)
    assert len(seen) == 1


def test_a_failing_cell_is_a_cell_error_with_its_index():
    # a policy parameter LRU does not take: the simulator raises (a request the pool could never
    # hold is refused and counted, never an error)
    trace = Trace([TraceRequest(0.0, "s", 0, list(range(10)), 160, 1)], block_size=16)
    cells = [SimSettings(capacity_blocks=20), SimSettings(capacity_blocks=5,
                                                          knobs=EngineKnobs(policy_params=(("bogus", 1),))),
             SimSettings(capacity_blocks=30)]
    with pytest.raises(CellError) as err:
        LocalPool(2).run(trace, cells, lambda index, run: None)
    assert err.value.index == 1
    assert type(err.value.error).__name__ == "InputError"
    assert str(err.value).startswith("cell 1 failed: InputError(")
