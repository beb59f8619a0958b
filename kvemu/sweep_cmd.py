"""``kvemu sweep``: policies x capacities x routings x replica counts, in parallel, resumable.

    kvemu sweep --trace mooncake-conversation \\
        --policy lru,s3fifo,belady --capacity-blocks 2000,8000,32000 --routing cache_aware,session \\
        --replicas 1,4 --out sweep.jsonl --csv sweep.csv --plot sweep.png [--resume] [--jobs 4 | --dask tcp://host:8786]

Every grid point is one ``kvemu sim`` run in a local worker process, or a task on a Dask
cluster with ``--dask``; see ``sim/cells.py`` for the runners, ``sim/sweep.py`` for the
results file and resuming, ``sim/sweep_plots.py`` for the figure.
"""

from __future__ import annotations

import argparse
import os
import sys
from contextlib import closing

from kvemu.options.config_file import add_config_arg
from kvemu.options.disagg import add_pd_args, topology
from kvemu.options.gpu import gpu_setting
from kvemu.options.kv_cache_dtype import model_setting
from kvemu.options.kv_store import add_shared_args
from kvemu.options.limits import default_capacity
from kvemu.options.matching import matching_setting
from kvemu.options.reuse import add_sweep_reuse_arg, sweep_reuse
from kvemu.options.scheduler import check_scheduler_flags
from kvemu.options.source import add_source_args
from kvemu.sim_cmd import add_emulation_args, capacities, check_no_ops, table_legend, warn_lengths
from kvemu.sim_grid import grid_parts, load_matched, sim_settings, split_numbers
from loadgen.formats import detect_format
from replica.core.cache.policies import policy_class
from router.strategies import get_strategy
from shared.errors import InputError
from shared.overrides import parse_pairs
from shared.validate import check_positive
from sim.cells import Runner
from sim.dask_cells import open_runner
from sim.pd_flow import cluster_label
from sim.simulator import saturation_warning
from sim.sweep import (
    MRC,
    Point,
    Progress,
    file_identity,
    make_point,
    mean_field,
    mrc_sources,
    read_records,
    run_points,
    sort_key,
    workload_identity,
    write_csv,
)


def configure(p: argparse.ArgumentParser) -> None:
    add_source_args(p)
    add_config_arg(p)
    p.add_argument("--policy", default="lru", metavar="P1,P2,...", help="eviction policies, e.g. lru,s3fifo,belady")
    p.add_argument("--routing", default="cache_aware", metavar="R1,R2,...", help="routing strategies")
    p.add_argument("--replicas", default=None, metavar="K1,K2,...",
                   help="replica counts (colocated ones; default 1, or 0 beside --prefill-replicas / --decode-replicas)")
    add_emulation_args(p)
    add_pd_args(p)
    add_shared_args(p)
    add_sweep_reuse_arg(p)
    p.add_argument("--seed", type=int, default=0, help="workload and routing seed")
    p.add_argument("--out", required=True, metavar="FILE.jsonl", help="results, one JSON line per point")
    p.add_argument("--csv", metavar="FILE.csv", help="(re)write the main scalar columns of every result here")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes (default: all cores)")
    p.add_argument("--dask", metavar="ADDRESS",
                   help="run the points on this Dask scheduler's workers (e.g. tcp://host:8786) instead of --jobs"
                        " local processes; needs pip install 'kvemu[dask]' here and on the workers")
    p.add_argument("--dask-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="how long to wait for the Dask scheduler and its first worker (default 10)")
    p.add_argument("--plot", metavar="FILE.png", help="capacity curves with MRC and mean-field overlays, load")
    p.add_argument("--resume", action="store_true", help="skip points already in --out, append the rest")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _names(text: str, field: str, check) -> list[str]:
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise InputError(field, "is empty")
    for name in names:
        check(name)  # unknown names list the valid ones
    return names


def _check_paths(args) -> None:
    for flag, path in (("--out", args.out), ("--csv", args.csv), ("--plot", args.plot)):
        if path is None:
            continue
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise InputError(flag, f"directory {parent} does not exist")
        if os.path.isdir(path):
            raise InputError(flag, f"{path} is a directory")
    if not args.resume and os.path.exists(args.out) and os.path.getsize(args.out) > 0:
        raise InputError("--out", f"{args.out} already has results; pass --resume to continue it, or remove it")


def _check_scalars(args) -> None:
    if args.jobs < 1:
        raise InputError("--jobs", f"must be >= 1, got {args.jobs}")
    check_scheduler_flags(args)  # --max-running and --token-budget among them
    check_positive("--dask-timeout", args.dask_timeout)


def _identity(args, trace) -> tuple[dict, dict]:
    """(what the point ids hash, what each record shows as ``trace``)."""
    if args.trace:
        fmt = detect_format(args.trace) if args.format == "auto" else args.format
        ident = file_identity(args.trace, fmt, trace.block_size)
        return ident, {"source": args.trace, **ident}
    ident = workload_identity(trace, args.duration)
    return ident, {"source": args.workload, **ident}


def build_grid(args, trace, identity: dict, policies, routings, replicas, caps) -> list:
    parts = grid_parts(args, trace.block_size)
    points: dict[str, Point] = {}
    for rt in routings:
        for k in replicas:
            # one replica: every routing sends everything to it, so its points run once
            route = routings[0] if k == 1 and parts.pd is None else rt
            for pol in policies:
                for c in caps:
                    s = sim_settings(args, parts, policy=pol, capacity_blocks=c, replicas=k, routing=route,
                                     reuse=sweep_reuse(args))
                    p = make_point(identity, s)
                    points.setdefault(p.id, p)
    return list(points.values())


def run(args) -> int:
    args.gpu, args.model = gpu_setting(args), model_setting(args)
    default_capacity(args, listed=True)  # no capacity flag: vLLM's default, as kvemu sim
    policies = _names(args.policy, "--policy", policy_class)
    routings = _names(args.routing, "--routing", get_strategy)
    pools = bool(args.prefill_replicas or args.decode_replicas)  # colocated replicas may be 0 beside P/D pools
    replicas = list(dict.fromkeys(split_numbers(args.replicas or ("0" if pools else "1"), int, "--replicas", pools)))
    _check_scalars(args)
    check_no_ops(args, [topology(args, k).total for k in replicas])  # one message for a half P/D cluster
    _check_paths(args)
    if args.plot:
        from sim.sweep_plots import require_matplotlib

        require_matplotlib()
    with closing(open_runner(args.jobs, args.dask, args.dask_timeout)) as runner:  # a bad --dask fails here
        return _sweep(args, runner, policies, routings, replicas)


def _sweep(args, runner: Runner, policies: list[str], routings: list[str], replicas: list[int]) -> int:
    matching = matching_setting(args)
    trace = load_matched(args, matching)
    caps = sorted(set(capacities(args, trace.block_size)))
    warn_lengths(args, caps, trace.block_size)
    identity, info = _identity(args, trace)
    grid = build_grid(args, trace, identity, policies, routings, replicas, caps)
    if 1 in replicas and len(routings) > 1 and not args.quiet and not (args.prefill_replicas or args.decode_replicas):
        print(f"sweep: with 1 replica every routing sends everything to it: those points run once, as"
              f" {routings[0]} ({(len(routings) - 1) * len(policies) * len(caps)} fewer runs)", file=sys.stderr)
    sources = mrc_sources(identity, grid) if args.plot else []
    extra = [p for p in sources if p.kind == MRC]
    have, bad = read_records(args.out) if args.resume else ({}, 0)
    todo = [p for p in grid + extra if p.id not in have]
    if not args.quiet:
        skipped = f", {len(grid) + len(extra) - len(todo)} already in {args.out}" if args.resume else ""
        torn = f" ({bad} unreadable line(s) ignored)" if bad else ""
        print(f"sweep: {len(grid)} grid points{_extras(extra)}{skipped}{torn}; "
              f"running {len(todo)} on {runner.where(len(todo))}", file=sys.stderr)
    progress = Progress(len(todo), args.quiet)
    try:
        run_points(trace, info, todo, args.out, runner, progress)
    except KeyboardInterrupt:
        print(f"sweep: stopped after {progress.done}/{len(todo)} points; they are in {args.out}, "
              "rerun with --resume for the rest", file=sys.stderr)
        raise
    _outputs(args, trace, grid, sources)
    return 0


def _extras(extra: list) -> str:
    """The runs beyond the grid, said for what they are: --plot's miss-ratio curve needs reuse distances, which
    the grid's runs do not track (``--reuse-distances`` makes them)."""
    if not extra:
        return ""
    n = len(extra)
    return (f" + {n} run{'s' if n > 1 else ''} marked +reuse (LRU at the largest capacity, tracking reuse distances"
            f" for the figure's miss-ratio curve: one per routing and replica count; not in the table)")


def _outputs(args, trace, grid: list, sources: list) -> None:
    """The table of this grid's points, the CSV of every point in --out, and the figure."""
    records, _ = read_records(args.out)
    mine = [records[p.id] for p in grid]
    print_table(sorted(mine, key=sort_key), sys.stdout)
    sys.stdout.write(table_legend(mine, lines_under=False) + "\n")
    warning = saturation_warning(mine)
    if warning:
        print(warning, file=sys.stderr)
    if args.csv:
        rows = write_csv(records.values(), args.csv)
        print(f"csv: {rows} rows written to {args.csv}", file=sys.stderr)
    if args.plot:
        from sim.sweep_plots import ceiling, plot_sweep

        plot_sweep(mine, [records[p.id] for p in sources], args.plot,
                   mean_field(trace, args.workload, parse_pairs(args.set)), ceiling(trace, args.response_kv))
        print(f"plot written to {args.plot}", file=sys.stderr)


TABLE = [("policy", "policy", "{}", 14), ("capacity_blocks", "capacity", "{:,}", 9), ("routing", "routing", "{}", 11),
         ("replicas", "R", "{}", 5), ("block_hit_ratio", "blk_hit", "{:.4f}", 7),
         ("token_hit_ratio", "tok_hit", "{:.4f}", 7), ("csr", "CSR", "{:.4f}", 7), ("holes", "holes/req", "{:.2f}", 9),
         ("ttft_p50_s", "ttft_p50_ms", "{:,.1f}", 14), ("ttft_p99_s", "ttft_p99_ms", "{:,.1f}", 14),
         ("load_imbalance", "imbal", "{:.2f}", 5), ("refused", "refused", "{:,}", 7), ("wall_s", "wall_s", "{:.1f}", 6)]


def print_table(records: list[dict], out) -> None:
    def cells(values):
        widths = [w for _, _, _, w in TABLE]
        return "  ".join(v.ljust(w) if i in (0, 2) else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths)))

    out.write(cells([head for _, head, _, _ in TABLE]) + "\n")
    for rec in records:
        values = []
        for key, _, fmt, _ in TABLE:
            value = rec["holes"]["mean_per_request"] if key == "holes" else cluster_label(rec) if key == "replicas" \
                else rec.get(key)  # refused: not in old records
            if value is None:  # e.g. no TTFT in a cache-only run: it has no clock
                values.append("-")
            else:
                values.append(fmt.format(value * 1000 if key.startswith("ttft") else value))  # ms, as the header says
        out.write(cells(values) + "\n")
