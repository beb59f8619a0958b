"""Where requests come from, for every command that takes them: a trace file or a generated preset."""

from __future__ import annotations

import argparse

from loadgen.formats import read_trace
from loadgen.trace import Trace
from shared.errors import InputError
from shared.overrides import parse_pairs


def add_source_args(p: argparse.ArgumentParser, duration: float = 600.0) -> None:
    """Where requests come from: a trace file or a generated preset (sim, sweep, replay)."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", metavar="NAME", help="a workload preset (see `kvemu gen --list`)")
    src.add_argument("--trace", metavar="FILE", help="a trace file")
    p.add_argument("--format", default="auto", help="trace format: auto, kvemu, mooncake, bailian")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="preset parameter (repeatable)")
    p.add_argument("--duration", type=float, default=duration, help="seconds of workload to generate (with --workload)")


def load_source(args) -> Trace:
    if args.trace:
        return read_trace(args.trace, args.format)
    from loadgen.workloads import generate

    if args.duration <= 0:
        raise InputError("--duration", f"must be positive, got {args.duration}")
    return generate(args.workload, args.duration, args.seed, parse_pairs(args.set))


def trace_name(source: str) -> str:
    """What a figure calls a trace: a built-in name, a file's base name, or '<name> preset'."""
    from loadgen.formats import BUILTIN_TRACES
    from loadgen.workloads import PRESETS

    source = str(source)
    base = source.replace("\\", "/").rsplit("/", 1)[-1]
    for name, file in BUILTIN_TRACES.items():
        if base == file:
            return name
    return f"{source} preset" if source in PRESETS else base
