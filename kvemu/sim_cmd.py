"""``kvemu sim``: virtual-time runs over a grid of policies x capacities."""

from __future__ import annotations

import argparse
import json
import os
import sys

from kvemu.options.arrivals import ARRIVALS, add_arrivals_arg, arrivals_mode
from kvemu.options.config_file import add_config_arg
from kvemu.options.disagg import add_pd_args, colocated_default, topology
from kvemu.options.gpu import add_gpu_args, gpu_setting
from kvemu.options.kv_cache_dtype import KV_CACHE_DTYPE, model_setting
from kvemu.options.kv_store import add_shared_args
from kvemu.options.limits import (
    MAX_MODEL_LEN,
    SIM_CAPACITY_OPTIONS,
    capacity_in_tokens,
    default_capacity,
    length_warning,
    pool_units,
)
from kvemu.options.matching import add_matching_args, matching_setting
from kvemu.options.option import add_options
from kvemu.options.parallel import add_parallel_args, expert_ranks, parallel_setting
from kvemu.options.prefix_caching import PREFIX_CACHING
from kvemu.options.requests_out import SESSIONS_OUT, add_requests_out_arg, requests_out
from kvemu.options.response_kv import add_response_kv_arg
from kvemu.options.reuse import add_sim_reuse_args, sim_reuse
from kvemu.options.scheduler import add_scheduler_args, check_scheduler_flags
from kvemu.options.source import add_source_args
from kvemu.options.speculative import add_speculative_args
from kvemu.options.tiers import add_tier_args
from kvemu.program import check_outputs
from kvemu.sim_grid import grid_parts, load_matched, sim_settings, split_numbers
from loadgen.source import trace_name
from loadgen.trace import Trace, has_dependencies
from replica.core.cache.policies import policy_class
from router.strategies import get_strategy
from shared import memory_rule
from shared.costmodel import CostModel
from shared.errors import InputError, KvemuError
from shared.gc_tuning import gc_paused
from shared.memory_rule import KvBudget
from shared.progress import ProgressBar
from sim.cells import CellError, LocalPool
from sim.pd_flow import cluster_label
from sim.run import simulate
from sim.simulator import SimSettings, saturation_warning


def add_emulation_args(p: argparse.ArgumentParser) -> None:
    """Capacity, model and replica scheduler settings shared by sim and sweep (no capacity flag: vLLM's
    default, kvemu.options.limits.default_capacity)."""
    add_options(p.add_mutually_exclusive_group(), SIM_CAPACITY_OPTIONS)
    MAX_MODEL_LEN.add(p)
    p.add_argument("--model", default="qwen3-coder-30b-a3b")
    KV_CACHE_DTYPE.add(p)
    add_gpu_args(p)
    add_matching_args(p)
    p.add_argument("--cache-only", action="store_true",
                   help="replay requests one at a time in trace order through routing, pool and policy only:"
                        " no scheduler, no cost-model clock, no latencies (what cache simulators do)")
    p.add_argument("--python-core", action="store_true",
                   help="run the Python pool even where the compiled one could (LRU, S3-FIFO, Belady, BeladyCompute:"
                        " the same results, 1.7-2.5x slower); the JSON's engine says which ran")
    add_scheduler_args(p, live=False)
    add_speculative_args(p)
    p.add_argument("--no-decode-kv", action="store_true",
                   help="count prompt blocks only, as cache simulators do (default: the KV of generated tokens takes"
                        " blocks as it fills them and the latest admitted request is preempted when none is left, as"
                        " in vLLM)")
    p.add_argument("--causal", action="store_true",
                   help="turn j+1 arrives when turn j finished plus their trace gap, as `kvemu replay` sends it"
                        " (default: every request at its trace time)")
    add_arrivals_arg(p)
    p.add_argument("--routing-set", action="append", default=[], metavar="NAME=VALUE",
                   help="routing setting, as `kvemu up --set` (e.g. bounded_load_factor=1.5)")
    add_response_kv_arg(p)
    PREFIX_CACHING.add(p)
    add_tier_args(p)
    add_parallel_args(p)


def configure(p: argparse.ArgumentParser) -> None:
    add_source_args(p)
    add_config_arg(p)
    p.add_argument("--replicas", type=int, default=None,
                   help="colocated replicas (default 1; 0 beside --prefill-replicas / --decode-replicas)")
    p.add_argument("--routing", default="cache_aware")
    p.add_argument("--policy", default="lru", help="comma-separated policies, e.g. lru,s3fifo,belady")
    p.add_argument("--policy-param", action="append", default=[], metavar="NAME=VALUE",
                   help="a policy parameter, given to every policy of --policy (e.g. interval_s=300 for adaptive)")
    add_emulation_args(p)
    add_pd_args(p)
    add_shared_args(p)
    add_sim_reuse_args(p)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="run the policy x capacity cells in this many processes at once (default: all cores)")
    p.add_argument("--json", metavar="FILE", help="write {\"runs\": [...]} here ('-' for stdout)")
    p.add_argument("--csv", metavar="FILE.csv", help="the main scalar columns of every run, one row each")
    add_requests_out_arg(p)
    SESSIONS_OUT.add(p)
    p.add_argument("--plot", metavar="FILE.png", help="hit ratio and CSR against capacity per policy (a P/D cluster:"
                   " also FILE-pd.png, its TTFT split and pools)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")


def capacities(args, block_size: int) -> list[int]:
    """Each capacity the flags ask for, in the pool's own unit: blocks of ``block_size`` tokens, pages under
    radix (``--capacity-blocks`` there counts blocks of 16 tokens: kvemu.options.limits)."""
    for flag in ("--capacity-blocks", "--capacity-tokens"):
        given = getattr(args, flag[2:].replace("-", "_"))
        if given:
            mode = matching_setting(args).mode
            return [_units(flag, n, block_size, mode) for n in split_numbers(given, int, flag)]
    cost = CostModel.from_names(args.model, args.gpu)
    if args.gpu_memory_utilization:  # vLLM's capacity rule: printed at start, refused when nothing is left
        budgets = memory_rules(args, block_size)
        blocks = [b.check() for b in budgets]
        for b in budgets:
            print(b.line(), file=sys.stderr)
        return blocks
    blocks = [cost.gib_to_blocks(g, block_size) for g in split_numbers(args.capacity_gib, float, "--capacity-gib")]
    if min(blocks) <= 0:
        raise InputError("--capacity-gib", "smaller than one block of this model")
    return blocks


def memory_rules(args, block_size: int) -> list[KvBudget]:
    """vLLM's memory rule at each ``--gpu-memory-utilization`` value, in the order given (the grid's capacities)."""
    cost = CostModel.from_names(args.model, args.gpu)
    ranks = expert_ranks(parallel_setting(args, cost.model), cost.tp)  # each rank's share of the experts
    return [memory_rule.kv_budget(cost, u, args.token_budget, args.max_running, block_size, expert_ranks=ranks)
            for u in split_numbers(args.gpu_memory_utilization, float, "--gpu-memory-utilization")]


def attach_memory_rules(args, runs: list[dict], block_size: int) -> None:
    """Each run sized by vLLM's memory rule carries its terms (``memory_rule``, as ``/stats`` does): the
    grid is policies x capacities, so run i has capacity i mod the count. A P/D run's pools are sized
    per role (kvemu.options.disagg), so only a colocated run carries it."""
    if not args.gpu_memory_utilization or any(r.get("pd") for r in runs):
        return
    rules = [b.breakdown() for b in memory_rules(args, block_size)]
    for i, run in enumerate(runs):
        run["memory_rule"] = rules[i % len(rules)]


def _units(flag: str, value: int, block_size: int, mode: str) -> int:
    """One --capacity-blocks / --capacity-tokens value in the pool's unit, with a note where not exact."""
    tokens = capacity_in_tokens(flag, value, mode)
    if tokens is None:
        return value
    units, note = pool_units(flag, value, tokens, block_size, mode)
    if note:
        print(note, file=sys.stderr)
    return units


def warn_lengths(args, caps: list[int], block_size: int) -> None:
    """The one-line warning (stderr) for each capacity whose pool cannot hold one request of
    max_model_len tokens (vLLM would refuse to start; the run goes on with the pool's size)."""
    if args.max_model_len is not None and args.max_model_len < 1:
        raise InputError("--max-model-len", f"must be a positive integer, got {args.max_model_len}")
    cost = CostModel.from_names(args.model, args.gpu)
    asked = args.max_model_len or cost.model.max_context
    # the blocks the pool counts: the model's (state layers raise the size, CostModel.kv_block_size)
    warning = length_warning(asked, args.max_model_len is not None, caps, cost.kv_block_size(block_size),
                             matching_setting(args).mode)
    if warning:
        print(warning, file=sys.stderr)




def check_no_ops(args, replicas: list[int]) -> None:
    """Refuse flags the run would ignore (one line naming the flag and why; a flag at its default is
    never refused): the scheduler's and the clock's with --cache-only, routing with one replica."""
    from kvemu.options.scheduler import SIM_SCHEDULER_OPTIONS
    from router.strategies import DEFAULT_STRATEGY

    if args.cache_only:
        given = [o.flag for o in SIM_SCHEDULER_OPTIONS if getattr(args, o.dest) != o.default]
        given += [flag for flag, on in (("--no-decode-kv", args.no_decode_kv), ("--causal", args.causal),
                                        (ARRIVALS.flag, getattr(args, ARRIVALS.dest) is not None)) if on]
        if given:
            raise InputError(given[0], "does nothing with --cache-only (requests replayed one at a time, no scheduler"
                                       " and no clock): drop one of the two")
    if max(replicas) == 1:
        routings = [r.strip() for r in args.routing.split(",") if r.strip()]
        if routings != [DEFAULT_STRATEGY] or args.routing_set:
            flag = "--routing-set" if args.routing_set else "--routing"
            raise InputError(flag, "does nothing with one replica (every request goes to it): add --replicas N")


def validate_names(policies: list[str], replicas: int, routing: str, pd: bool = False) -> None:
    """What needs no trace is checked before any trace is read or capacity computed."""
    if not policies:
        raise InputError("--policy", "is empty")
    for name in policies:
        policy_class(name)
    if replicas < 0 or (replicas == 0 and not pd):
        raise InputError("--replicas", f"must be a positive integer, got {replicas}")
    get_strategy(routing)


def run(args) -> int:
    check_outputs(args)
    if args.jobs < 1:
        raise InputError("--jobs", f"must be >= 1, got {args.jobs}")
    # The collector paused from the trace's read until the trace is freed: meanwhile it would traverse
    # the trace's millions of fresh objects three times (young, middle, oldest generation) and free
    # nothing (a run makes no cycles: tests/sim/test_gc_free.py); 0.2-0.4 s of a cache-only run of a
    # 20x trace. Freed by reference counting before the collector is back, the trace is not traversed.
    records_path, sessions_path = requests_out(args), requests_out(args, SESSIONS_OUT)
    flag = "--requests-out" if records_path else SESSIONS_OUT.flag
    if (records_path or sessions_path) and args.cache_only:
        raise InputError(flag, "a --cache-only run has no clock, so no request has a time: drop one of the two")
    with gc_paused():
        trace, grid = runs_of(args)
        if (records_path or sessions_path) and len(grid) > 1:
            raise InputError(flag, f"writes one run's requests, but the flags ask for {len(grid)} runs"
                                   " (policies x capacities): give one --policy and one capacity")
        recorded = bool(records_path or sessions_path)
        runs = run_serial(trace, grid, args.quiet, recorded) if args.jobs == 1 or len(grid) == 1 else \
            run_parallel(trace, grid, args.jobs, args.quiet)
        records = runs[0].pop("request_records") if recorded else None
        paths = runs[0].pop("agent_paths", []) if recorded else []
        print_table(runs, sys.stderr if args.json == "-" else sys.stdout)  # stdout carries only the JSON then
        warning = saturation_warning(runs)
        if warning:
            print(warning, file=sys.stderr)
        for reason in dict.fromkeys(r["engine_reason"] for r in runs if r.get("engine_reason")):
            print(f"note: the Python pool ran, slower, with the same results: {reason}", file=sys.stderr)
        attach_memory_rules(args, runs, trace.block_size)
        _write_outputs(args, trace, runs)
        if records_path:
            write_records(records_path, records or [], runs[0])
        if sessions_path:
            write_sessions(sessions_path, paths)
        del trace
    return 0


def runs_of(args) -> tuple[Trace, list[SimSettings]]:
    """The trace and the grid of runs ``kvemu sim``'s flags ask for, every flag checked (what
    bench/bench_flashgen.py runs its configurations through, so that each is a command line)."""
    args.gpu, args.model = gpu_setting(args), model_setting(args)
    default_capacity(args, listed=True)  # before the P/D pools are sized: one on another GPU follows the same rule
    args.replicas = colocated_default(args, args.replicas, 1)
    policies = [p.strip() for p in args.policy.split(",") if p.strip()]
    cluster = topology(args, args.replicas)  # the pools' sizes, checked before the trace is read
    validate_names(policies, args.replicas, args.routing, cluster.disaggregated)
    check_no_ops(args, [cluster.total])
    check_scheduler_flags(args)
    matching = matching_setting(args)
    trace = load_matched(args, matching)
    if not trace.requests:
        raise InputError("trace", "has no requests")
    caps = capacities(args, trace.block_size)
    warn_lengths(args, caps, trace.block_size)
    parts = grid_parts(args, trace.block_size)
    arrivals = arrivals_mode(args, has_dependencies(trace))
    grid = [sim_settings(args, parts, policy=pol, capacity_blocks=c, replicas=args.replicas, routing=args.routing,
                         reuse=sim_reuse(args), arrivals=arrivals)
            for pol in policies for c in caps]  # validates every name before the first run
    return trace, grid


def _write_outputs(args, trace: Trace, runs: list[dict]) -> None:
    if args.json:
        doc = json.dumps({"trace": trace.source, "runs": runs}, indent=1)
        if args.json == "-":
            print(doc)
        else:
            with open(args.json, "w") as fh:
                fh.write(doc)
    if args.csv:
        from sim.sweep import CSV_COLUMNS, write_rows

        rows = write_rows([{**r, "trace": trace.source} for r in runs], args.csv, CSV_COLUMNS[1:])
        print(f"csv: {rows} rows written to {args.csv}", file=sys.stderr)
    if args.plot:
        from sim.plots import plot_capacity_curves
        from sim.sweep_plots import ceiling
        plot_capacity_curves(runs, args.plot, trace_name(trace.source), ceiling(trace, args.response_kv))
        print(f"plot written to {args.plot}", file=sys.stderr)
        if runs[0].get("pd"):  # a P/D run: its TTFT split and pools beside it, FILE-pd.png
            from sim.pd_plots import plot_pd_runs
            path = os.path.splitext(args.plot)[0] + "-pd.png"
            plot_pd_runs(runs, path, trace_name(trace.source))
            print(f"plot written to {path}", file=sys.stderr)


def run_serial(trace: Trace, grid: list[SimSettings], quiet: bool, records: bool = False) -> list[dict]:
    """The cells one after another in this process, with a progress bar over each one's requests; ``records``:
    each run with its per-request results (``request_records``)."""
    runs = []
    for i, settings in enumerate(grid, 1):
        label = f"[{i}/{len(grid)}] {settings.knobs.policy} @ {_capacity(settings)}"
        progress = None if quiet else ProgressBar(label, len(trace.requests), "req")
        runs.append(simulate(trace, settings, progress, records))
    return runs


def write_records(path: str, records: list, run: dict) -> None:
    """``--requests-out``: the file, and one line on stderr with the run's exact means."""
    from loadgen.request_metrics import write_requests

    n = write_requests(path, records)
    lat = run.get("latency") or {}
    means = ", ".join(f"{name} {lat[f'{key}_mean_s'] * 1000:,.1f} ms" for name, key in
                      (("TTFT", "ttft"), ("TPOT", "tpot"), ("E2E", "e2e")) if lat.get(f"{key}_mean_s") is not None)
    span = f"; makespan {lat['makespan_s']:,.1f} s" if lat.get("makespan_s") is not None else ""
    print(f"requests: {n:,} written to {path}" + (f" (mean {means}{span})" if means else ""), file=sys.stderr)


def write_sessions(path: str, paths: list[dict]) -> None:
    """``--sessions-out``: one JSON line per finished agent session (none where the trace has no dependencies)."""
    try:
        with open(path, "w") as fh:
            fh.writelines(json.dumps(p) + "\n" for p in paths)
    except OSError as exc:
        raise InputError(SESSIONS_OUT.flag, f"cannot write {path}: {exc.strerror or exc}") from None
    print(f"agent sessions: {len(paths):,} written to {path}", file=sys.stderr)


def run_parallel(trace: Trace, grid: list[SimSettings], jobs: int, quiet: bool) -> list[dict]:
    """The cells on ``jobs`` worker processes, with progress over cells; runs in grid order."""
    runs: list[dict | None] = [None] * len(grid)
    pool = LocalPool(jobs)
    bar = ProgressBar(f"sim on {pool.where(len(grid))}", len(grid), "cell", enabled=not quiet, log_every_s=0.0)

    def finished(index: int, run: dict) -> None:
        runs[index] = run
        s = grid[index]
        bar.note(f"  {s.knobs.policy} @ {_capacity(s)}: block hit (HBM) {run['block_hit_ratio']:.4f}, {run['wall_s']:.1f} s")
        bar.update()

    try:
        pool.run(trace, grid, finished)
    except CellError as exc:
        s = grid[exc.index]
        raise KvemuError(f"{s.knobs.policy} @ {_capacity(s)} failed: {exc.error!r}") from exc
    return [r for r in runs if r is not None]


def _capacity(s: SimSettings) -> str:
    """A run's capacity in the pool's own unit, named: blocks, or pages under radix."""
    return f"{s.capacity_blocks:,} {'pages' if s.knobs.matching == 'radix' else 'blocks'}"


def print_table(runs: list[dict], out) -> None:
    """Hit ratios, CSR, holes, and TTFT in emulated milliseconds (the JSON keeps seconds), the lines a row
    of a P/D cluster or of lower memory levels has under it, and the legend of the columns."""
    cols = [("policy", "{}", 14), ("capacity_blocks", "{:,}", 10), ("replicas", "{}", 5),
            ("block_hit_ratio", "{:.4f}", 8), ("token_hit_ratio", "{:.4f}", 8), ("csr", "{:.4f}", 8),
            ("holes/req", "{:.2f}", 9), ("ttft_p50_s", "{:,.1f}", 14), ("ttft_p99_s", "{:,.1f}", 14),
            ("load_imbalance", "{:.2f}", 6), ("refused", "{:,}", 7)]
    heads = ["policy", "capacity", "R", "blk_hit", "tok_hit", "CSR", "holes/req", "ttft_p50_ms", "ttft_p99_ms",
             "imbal", "refused"]
    out.write("  ".join(h.rjust(w) if i else h.ljust(w) for i, (h, (_, _, w)) in enumerate(zip(heads, cols))) + "\n")
    for r in runs:
        cells = []
        for i, (key, fmt, w) in enumerate(cols):
            value = r["holes"]["mean_per_request"] if key == "holes/req" else \
                cluster_label(r) if key == "replicas" else r[key]
            text = "-" if value is None else fmt.format(value * 1000 if key.startswith("ttft") else value)
            cells.append(text.ljust(w) if i == 0 else text.rjust(w))
        out.write("  ".join(cells) + "\n")
        if r.get("pd"):
            out.write(pd_line(r["pd"]) + "\n")
        for line in (levels_line(r), agent_line(r)):
            if line:
                out.write(line + "\n")
    out.write(table_legend(runs) + "\n")


def agent_line(run: dict) -> str | None:
    """A trace with dependencies: the agent sessions' task time and critical path parts, p50/p99 in seconds (each
    its own percentile, docs/agentic.md); None without."""
    a = run.get("agent_sessions")
    if not a:
        return None
    if not a["sessions"]:
        return f"  agent sessions: none finished ({a['incomplete']:,} incomplete)"
    parts = ", ".join(f"{name} {a[f'{name}_p50_s']:,.2f}/{a[f'{name}_p99_s']:,.2f}"
                      for name in ("queue", "prefill", "decode", "tool", "other"))
    return (f"  agent sessions {a['sessions']:,} ({a['incomplete']:,} incomplete): task time s p50/p99"
            f" {a['task_p50_s']:,.2f}/{a['task_p99_s']:,.2f}; critical path {parts}")


def table_legend(runs: list[dict], lines_under: bool = True) -> str:
    """What the columns of ``kvemu sim``'s and ``kvemu sweep``'s tables are (docs/glossary.md has each at
    length); the P/D and lower-level parts only where a run has them (``lines_under``: the table prints each
    row's lower levels under it, as sim's does)."""
    pd = any(r.get("pd") for r in runs)
    lower = lines_under and any(r.get("tiers") for r in runs)
    return ("  blk_hit, tok_hit: prompt blocks, tokens found in HBM" + (" (every level: the line under a row)" if lower
                                                                       else "")
            + "; CSR: prefill compute HBM hits saved / all of it\n"
            "  holes/req: gaps recomputed before a reused block, per request; R: replicas"
            + (" (P/D: prefill P:decode D)" if pd else "") + "; imbal: max / mean requests per replica"
            + (" (P/D: the decode pool)" if pd else "")
            + "\n  ttft: emulated ms; refused: never run (over --max-model-len or the pool); more: docs/glossary.md")


def levels_line(run: dict) -> str | None:
    """A run with memory below HBM: the block hit ratio of each level and of every level (HBM + lower, what was not
    recomputed), and what a shared store did; None without lower levels."""
    tiers = run.get("tiers")
    if not tiers:
        return None
    kinds = [k for k in ("host", "ssd", "shared") if (tiers.get(f"{k}_blocks") or 0) > 0]
    hits = ", ".join(f"{k} {run[f'{k}_block_hit_ratio']:.4f}" for k in ("hbm", *kinds))
    line = f"  block hit ratio by level: {hits}; all levels (HBM + lower) {run['all_levels_block_hit_ratio']:.4f}"
    stores = tiers.get("shared")
    if not stores:
        return line
    used, cap = sum(x["used_blocks"] for x in stores), sum(x["blocks"] for x in stores)
    return (line + f"\n  shared store{'s' if len(stores) > 1 else ''}: {used:,}/{cap:,} blocks held,"
            f" {sum(x['evictions'] for x in stores):,} chunks evicted, {sum(x['refused_writes'] for x in stores):,} writes"
            f" refused, {sum(x['bytes_moved'] for x in stores) / 1e9:,.1f} GB through it")


def pd_line(pd: dict) -> str:
    """A P/D run's own lines under its row: the path requests took, TTFT by part, the link."""
    topo, req, split = pd["topology"], pd["requests"], pd["ttft_split"]
    pools = f"{topo['prefill']}P:{topo['decode']}D" + (f" + {topo['colocated']} colocated" if topo["colocated"] else "")
    parts = "  ".join(f"{name} {split[f'{name}_p50_s'] * 1000:,.1f}/{split[f'{name}_p99_s'] * 1000:,.1f}"
                      for name in ("queue", "prefill", "transfer", "first_decode"))
    links = pd["links"]
    busiest = max(links.items(), key=lambda kv: kv[1]["utilization"], default=None)
    link = f"busiest NIC {busiest[0]} {busiest[1]['utilization']:.1%}" if busiest else "no transfer"
    return (f"  P/D {pools}: remote {req['remote']:,}, local {req['local']:,}, failover {req['failover']:,};"
            f" TTFT ms p50/p99 {parts}\n"
            f"  transfer {pd['transfer_bytes'] / 1e9:,.2f} GB ({pd['transfer_tokens']:,} tokens, {pd['saved_tokens']:,}"
            f" held by the decoder); {link}")
