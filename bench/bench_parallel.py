"""Parallel cells, side by side in one run: `kvemu sim` over a policies x capacities grid with
``--jobs 1`` against ``--jobs N``, and `kvemu sweep` on the local pool against a Dask
``LocalCluster`` of N single-threaded worker processes. Runs alternate; each command is a
fresh ``kvemu`` process, timed end to end (trace read included). Prints JSON.

    python bench/bench_parallel.py [--duration 3600] [--jobs 2] [--repeat 2] [--no-dask] [--no-reuse-distances]

The trace is the ``scm`` preset (seed 1) at ``--duration`` seconds, written once to a temporary
file. The results of every run are compared (apart from ``wall_s``) and must be identical.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loadgen.formats import write_kvemu
from loadgen.workloads import generate

GRID = ["--policy", "lru,s3fifo", "--capacity-blocks", "2000,4000,8000", "--quiet"]


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and the worker processes it waited for)."""
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kvemu", *argv], check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)


def strip_wall(runs: list[dict]) -> list[str]:
    return sorted(json.dumps({k: v for k, v in r.items() if k != "wall_s"}, sort_keys=True) for r in runs)


def bench_sim(trace: Path, tmp: Path, jobs: int, repeat: int, flags: list[str]) -> dict:
    times: dict[str, list[float]] = {"jobs_1": [], f"jobs_{jobs}": []}
    cpu: dict[str, list[float]] = {"jobs_1": [], f"jobs_{jobs}": []}
    outputs = {}
    for r in range(repeat):
        for n in (1, jobs):
            out = tmp / f"sim-{n}-{r}.json"
            wall, used = timed(["sim", "--trace", str(trace), *GRID, *flags, "--jobs", str(n), "--json", str(out)])
            times[f"jobs_{n}"].append(round(wall, 2))
            cpu[f"jobs_{n}"].append(round(used, 2))
            outputs[out] = strip_wall(json.loads(out.read_text())["runs"])
    assert len(set(map(tuple, outputs.values()))) == 1, "parallel sim runs differ from serial ones"
    best = {k: min(v) for k, v in times.items()}
    return {"cells": 6, "flags": flags, "wall_s": times, "cpu_s": cpu, "best_wall_s": best,
            "speedup": round(best["jobs_1"] / best[f"jobs_{jobs}"], 3), "identical": True}


def bench_sweep(trace: Path, tmp: Path, jobs: int, repeat: int) -> dict:
    from distributed import LocalCluster

    times: dict[str, list[float]] = {"local_pool": [], "dask": []}
    outputs = {}
    with LocalCluster(n_workers=jobs, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=":0") as cluster:
        for r in range(repeat):
            for kind, extra in (("local_pool", ["--jobs", str(jobs)]), ("dask", ["--dask", cluster.scheduler_address])):
                out = tmp / f"sweep-{kind}-{r}.jsonl"
                times[kind].append(round(timed(["sweep", "--trace", str(trace), *GRID, "--out", str(out), *extra])[0], 2))
                outputs[out] = strip_wall([json.loads(line) for line in out.read_text().splitlines()])
    assert len(set(map(tuple, outputs.values()))) == 1, "Dask sweep records differ from the local pool's"
    best = {k: min(v) for k, v in times.items()}
    return {"points": 6, "wall_s": times, "best_wall_s": best,
            "dask_over_local": round(best["dask"] / best["local_pool"], 3), "identical": True}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=3600)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-dask", action="store_true")
    ap.add_argument("--no-reuse-distances", action="store_true", help="pass it to `kvemu sim` (sweeps never track them)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        trace = tmp / "scm.jsonl"
        write_kvemu(generate("scm", args.duration, seed=1), trace)
        report = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                              "load_avg_1m": round(os.getloadavg()[0], 2)},
                  "trace": {"workload": "scm", "duration_s": args.duration, "seed": 1},
                  "sim": bench_sim(trace, tmp, args.jobs, args.repeat,
                                   ["--no-reuse-distances"] if args.no_reuse_distances else [])}
        if not args.no_dask:
            report["sweep"] = bench_sweep(trace, tmp, args.jobs, args.repeat)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
