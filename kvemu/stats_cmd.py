"""``kvemu trace-stats FILE``: summarise a trace as a table or as JSON."""

from __future__ import annotations

import argparse
import json

from loadgen.formats import FORMATS, read_trace
from loadgen.stats import Distribution, TraceStats, trace_stats


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="trace file (JSON lines)")
    parser.add_argument(
        "--format",
        default="auto",
        metavar="F",
        help=f"trace format: auto (default, from the first record), {', '.join(FORMATS)}",
    )
    parser.add_argument(
        "--block-size",
        type=_positive_int,
        default=None,
        metavar="N",
        help="tokens per block (default: the trace header, else 512 for Mooncake, 16 otherwise)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def _num(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.{digits}f}"


def _dist_row(label: str, d: Distribution, digits: int = 1) -> str:
    cells = [_num(d.count), _num(d.mean, digits), _num(d.p50, digits), _num(d.p90, digits), _num(d.p99, digits), _num(d.max, digits)]
    return f"  {label:<26}" + "".join(f"{c:>11}" for c in cells)


def format_table(s: TraceStats) -> str:
    lines = [
        f"trace           {s.source}",
        f"block size      {s.block_size} tokens",
        f"requests        {s.requests:,}",
        f"sessions        {s.sessions:,} ({s.single_turn_sessions:,} single-turn)",
        f"duration        {s.duration_s:,.1f} s",
        f"input tokens    {s.input_tokens:,}",
        f"output tokens   {s.output_tokens:,}",
        f"block accesses  {s.block_accesses:,}",
        f"distinct blocks {s.distinct_blocks:,}",
        f"infinite-cache block hit  {s.infinite_cache_block_hit:.3f}",
        "",
        f"  {'distribution':<26}" + "".join(f"{h:>11}" for h in ("count", "mean", "p50", "p90", "p99", "max")),
        _dist_row("turns per session", s.turns_per_session),
        _dist_row("intra-session gap (s)", s.intra_session_gap_s),
        _dist_row("session footprint (blocks)", s.session_footprint_blocks),
        _dist_row("input tokens / request", s.input_tokens_per_request),
        _dist_row("output tokens / request", s.output_tokens_per_request),
    ]
    if s.kinds:
        lines += ["", f"  {'kind':<10}" + "".join(f"{h:>16}" for h in ("requests", "sessions", "block accesses", "input tokens"))]
        for kind, k in s.kinds.items():
            cells = (k.requests, k.sessions, k.block_accesses, k.input_tokens)
            lines.append(f"  {kind:<10}" + "".join(f"{c:>16,}" for c in cells))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    trace = read_trace(args.file, fmt=args.format, block_size=args.block_size)
    stats = trace_stats(trace)
    if args.json:
        print(json.dumps(stats.to_dict(), indent=2))
    else:
        print(format_table(stats))
    return 0
