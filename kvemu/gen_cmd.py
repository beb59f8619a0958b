"""``kvemu gen``: generate a workload preset into a kvemu trace JSONL file.

    kvemu gen --workload mix --duration 3600 --set agent_frac=0.5 ... --seed 1 -o mix.jsonl
    kvemu gen --list
"""

from __future__ import annotations

import argparse
import os

from loadgen import workloads
from loadgen.formats import write_kvemu
from shared.errors import InputError, UnknownNameError
from shared.overrides import parse_pairs
from shared.progress import ProgressBar


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", "-w", metavar="NAME",
                        help=f"preset: {', '.join(workloads.PRESETS)} (see --list)")
    parser.add_argument("--duration", type=float, default=3600.0, metavar="S",
                        help="seconds of session arrivals; later turns may run past it (default 3600)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", dest="overrides",
                        help="override a preset parameter; repeatable (mix: multi.turns_mean=8)")
    parser.add_argument("--seed", type=int, default=0, help="random seed; same seed, same trace (default 0)")
    parser.add_argument("-o", "--output", metavar="FILE", help="trace JSONL to write")
    parser.add_argument("--list", action="store_true", help="list presets with their parameters and defaults")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")


def run(args: argparse.Namespace) -> int:
    if args.list:
        print(workloads.describe_presets())
        return 0
    if not args.workload:
        raise InputError("--workload", f"required; one of {', '.join(workloads.PRESETS)} (or --list)")
    if args.workload not in workloads.PRESETS:  # one line, and where the parameters are listed
        raise UnknownNameError("workload", args.workload, list(workloads.PRESETS),
                               " (`kvemu gen --list` shows their parameters)")
    if not args.output:
        raise InputError("--output", "required: the trace file to write")
    params = workloads.get_preset(args.workload, parse_pairs(args.overrides))
    folder = os.path.dirname(os.path.abspath(args.output))
    if not os.path.isdir(folder):  # fail before minutes of generating, not after
        raise InputError("--output", f"cannot write {args.output}: folder {folder} does not exist")
    progress = None if args.quiet else ProgressBar("generating sessions", 0, "session")
    trace = workloads.generate_from(params, args.duration, args.seed, progress=progress)
    try:
        write_kvemu(trace, args.output)
    except OSError as exc:
        raise InputError("--output", f"cannot write {args.output}: {exc.strerror or exc}") from None
    print(f"wrote {len(trace.requests)} requests, {trace.meta['sessions']} sessions of {args.workload} "
          f"(block_size {trace.block_size}, seed {args.seed}) to {args.output}")
    return 0
