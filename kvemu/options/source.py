"""Where requests come from, as flags: a trace file or a generated preset (sim, sweep, replay);
``loadgen.source.load_source`` reads what they name."""

from __future__ import annotations

import argparse


def add_source_args(p: argparse.ArgumentParser, duration: float = 600.0) -> None:
    """Where requests come from: a trace file or a generated preset (sim, sweep, replay)."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--workload", metavar="NAME", help="a workload preset (see `kvemu gen --list`)")
    src.add_argument("--trace", metavar="FILE", help="a trace file")
    p.add_argument("--format", default="auto", help="trace format: auto (told by the first line's keys), kvemu, mooncake,"
                                                    " bailian, openai, llmservingsim, agentic-mooncake, cc-traces")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="preset parameter (repeatable)")
    p.add_argument("--duration", type=float, default=duration, help="seconds of workload to generate (with --workload)")
