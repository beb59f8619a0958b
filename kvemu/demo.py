"""``kvemu demo``: bring up 4 replicas behind the router (embedded index), replay a short
built-in workload, print the report, and shut everything down. No Redis needed."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import sys
import time

from kvemu.options.limits import CAPACITY_OPTIONS
from kvemu.program import check_outputs
from kvemu.replay_cmd import cluster_report, print_report, replica_stats
from kvemu.up import add_cluster_args, bring_up, print_limit_lines, validate
from loadgen.replay import Replayer, records_json, summarize
from loadgen.trace import Trace
from loadgen.workloads import generate
from shared.errors import KvemuError
from shared.overrides import parse_pairs


def configure(p: argparse.ArgumentParser) -> None:
    add_cluster_args(p, replicas=4)
    p.set_defaults(time_scale=0.05)
    p.add_argument("--port", type=int, default=0, help="router port (default: a free one)")
    p.add_argument("--workload", default="mix")
    p.add_argument("--workload-set", action="append", default=[], metavar="NAME=VALUE")
    p.add_argument("--duration", type=float, default=300.0, help="seconds of trace time to replay")
    p.add_argument("--speedup", type=float, default=20.0, help="trace time compression (time scale = 1/speedup)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", metavar="OUT")
    p.add_argument("--plot", metavar="OUT.png", default="kvemu-demo.png",
                   help="the summary figure (default: kvemu-demo.png in the current directory)")
    p.add_argument("--quiet", action="store_true")


def demo_trace(a) -> Trace:
    trace = generate(a.workload, a.duration, a.seed, parse_pairs(a.workload_set))
    # Sessions that start late run past the window; a demo replays just the window.
    trace.requests = [r for r in trace.requests if r.t < a.duration]
    return trace


def _capacity(a) -> str:
    if a.capacity_blocks:
        return f"{a.capacity_blocks} blocks"
    if a.capacity_tokens:
        return f"{a.capacity_tokens} tokens"
    if a.capacity_gib:
        return f"{a.capacity_gib} GiB"
    return f"--gpu-memory-utilization {a.gpu_memory_utilization:g}"


DEMO_BLOCKS = 8192  # blocks of 16 tokens: the presets' 128K-token context cap
DEMO_MAX_MODEL_LEN = 131_072  # what DEMO_BLOCKS hold, and the presets' longest request


def demo_defaults(a) -> None:
    """The demo's own sizing where the flags give none: a pool of DEMO_BLOCKS and a context limit it holds,
    so its replicas start as vLLM would (the model's 262,144-token window would not fit such a pool)."""
    if all(getattr(a, o.dest) is None for o in CAPACITY_OPTIONS):  # not a
        # parser default: --capacity-gib or --gpu-memory-utilization must win
        a.capacity_blocks = DEMO_BLOCKS
        if a.max_model_len is None:
            a.max_model_len = DEMO_MAX_MODEL_LEN
    if a.time_scale == 0.05 and a.speedup != 20.0:
        a.time_scale = 1.0 / a.speedup  # keep emulated GPU time in step with compressed trace time


def run(a) -> int:
    demo_defaults(a)
    plan = validate(a)
    check_outputs(a, ("--json", "--plot"))
    if not a.quiet:
        print_limit_lines(plan)
    started = time.monotonic()
    trace = demo_trace(a)
    say = (lambda *_: None) if a.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    limit = f" (context limit {a.max_model_len:,} tokens)" if a.max_model_len else ""
    say(f"demo: {len(trace.requests):,} requests of the {a.workload!r} workload ({a.duration:.0f} s of trace time,"
        f" replayed {a.speedup:g}x faster) on {plan.topology.total} replicas x {_capacity(plan.flags)}{limit}, {a.policy},"
        f" {a.routing} routing")
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    cluster = bring_up(plan)
    try:
        say(f"demo: cluster up in {time.monotonic() - started:.1f} s, router at {cluster.router_url}")
        before = replica_stats(cluster.router_url)
        replayer = Replayer(cluster.router_url, trace, a.speedup, progress=not a.quiet)
        records = asyncio.run(replayer.run())
        summary = summarize(records, trace.block_size)
        report = cluster_report(cluster.router_url, before)
    finally:
        cluster.stop()
    if summary["failed"] == 0 and cluster.tmpdir:
        shutil.rmtree(cluster.tmpdir, ignore_errors=True)  # logs are kept only when something failed
    print()
    print_report(summary, report)
    print(f"\ndemo finished in {time.monotonic() - started:.1f} s")
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"summary": summary, "cluster": report, "records": records_json(records)}, fh, indent=1)
    _summary_png(a, trace, summary, report, records)
    return 0 if summary["failed"] == 0 else 1


def _summary_png(a, trace, summary: dict, report: dict, records) -> None:
    """The one summary figure the demo ends with, and where it is."""
    try:
        from kvemu.replay_cmd import plot_context
        from loadgen.plots import plot_replay

        ctx = plot_context(trace, trace.requests, a.speedup, report, source=f"{a.workload} preset")
        plot_replay(summary, records, a.plot, ctx)
    except KvemuError as exc:  # matplotlib missing: the report above stands on its own
        print(f"\nno summary figure: {exc}")
        return
    print(f"\nsummary figure: {os.path.abspath(a.plot)}")
