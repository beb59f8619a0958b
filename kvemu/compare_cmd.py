"""``kvemu compare MEASURED PREDICTED``: two runs of the same requests side by side (TTFT, TPOT, ITL, E2E,
makespan, throughput) with relative errors and the per-request error distribution; a table, ``--json``,
``--plot``. The formats it reads and what each figure means: ``loadgen.compare``."""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from typing import TextIO

from kvemu.program import check_outputs
from loadgen.compare import FORMATS, ITL_NOTE, METRICS, PER_REQUEST, STATS, Comparison, compare, read_run

NAMES = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2e": "E2E"}
RUN_ROWS = (("makespan_s", "makespan (s)", 1.0), ("throughput_rps", "throughput (requests/s)", 1.0),
            ("output_tokens_per_s", "output throughput (tokens/s)", 1.0))


def configure(parser: argparse.ArgumentParser) -> None:
    known = ", ".join(FORMATS.values())
    parser.add_argument("measured", metavar="MEASURED", help=f"the real engine's per-request results ({known})")
    parser.add_argument("predicted", metavar="PREDICTED", help="the prediction of the same requests, in any of"
                        " those formats (kvemu sim --requests-out)")
    parser.add_argument("--json", metavar="OUT", help="write every figure and error here as JSON ('-' for stdout)")
    parser.add_argument("--plot", metavar="OUT.png", help="CDFs of TTFT, TPOT and E2E, measured and predicted, and"
                        " each request's predicted E2E against its measured one")


def _cell(value: float | None, scale: float) -> str:
    if value is None:
        return "-"
    return f"{value * scale:,.1f}" if abs(value * scale) >= 10 else f"{value * scale:.3f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def table_lines(cmp: Comparison) -> list[str]:
    """The comparison as a table: each figure measured, predicted and (predicted - measured) / measured."""
    def side(role: str, run) -> str:
        done = sum(r.finish_s is not None for r in run.records)
        return f"{role:<10} {run.path} ({FORMATS[run.format]}, {len(run.records):,} requests, {done:,} finished)"

    lines = [side("measured", cmp.measured), side("predicted", cmp.predicted), "",
             f"{'metric':<30}{'measured':>14}{'predicted':>14}{'rel. error':>12}"]
    for name in METRICS:
        mean = cmp.figures[f"{name}_mean_s"].measured
        scale, unit = (1000.0, "ms") if mean is not None and mean < 1.0 else (1.0, "s")
        for stat in STATS:
            f = cmp.figures[f"{name}_{stat}_s"]
            if name == "itl" and stat != "mean":
                continue  # no per-token times: see the note below the table
            label = f"{NAMES[name]} {stat}{' *' if name == 'itl' else ''} ({unit})"
            lines.append(f"{label:<30}{_cell(f.measured, scale):>14}{_cell(f.predicted, scale):>14}"
                         f"{_percent(f.rel_error):>12}")
    for key, label, scale in RUN_ROWS:
        f = cmp.figures[key]
        lines.append(f"{label:<30}{_cell(f.measured, scale):>14}{_cell(f.predicted, scale):>14}"
                     f"{_percent(f.rel_error):>12}")
    lines += ["", f"{'per-request |relative error|':<30}{'median':>14}{'p90':>14}{'requests':>12}"]
    for name in PER_REQUEST:
        e = cmp.per_request[name]
        med, p90 = ("-" if v is None else f"{v * 100:.1f}%" for v in (e.median, e.p90))
        lines.append(f"{NAMES[name]:<30}{med:>14}{p90:>14}{e.pairs:>12,}")
    lines += ["", *textwrap.wrap(f"* ITL: {ITL_NOTE}", 100, subsequent_indent="  ")]
    return lines


def _emit(lines: list[str], out: TextIO) -> None:
    print("\n".join(lines), file=out)


def run(args: argparse.Namespace) -> int:
    check_outputs(args, ("--json", "--plot"))
    cmp = compare(read_run(args.measured), read_run(args.predicted))
    _emit(table_lines(cmp), sys.stderr if args.json == "-" else sys.stdout)  # stdout carries only the JSON then
    if args.json:
        doc = json.dumps(cmp.to_dict(), indent=1)
        if args.json == "-":
            print(doc)
        else:
            with open(args.json, "w") as fh:
                fh.write(doc + "\n")
            print(f"JSON written to {args.json}", file=sys.stderr)
    if args.plot:
        from loadgen.compare_plots import plot_comparison

        plot_comparison(cmp, args.plot)
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0
