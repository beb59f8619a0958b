"""The command line of a study script (bench_pd.py, bench_shared_store.py; bench_step_cost.py prints its
JSON the same way): the flags they share, their comma lists of known names, the JSON document on stdout and
in ``--out``, its figures, and ``--from``, which reads a saved document back to print its tables and draw
its figures without running anything.

Imported as ``bench.study_cli``: a script puts the repository root on ``sys.path`` first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Collection

PlotStudy = Callable[[dict, str], list[str]]  # (document, folder) -> the PNGs written


def add_study_flags(p: argparse.ArgumentParser, plots: str) -> None:
    """``--jobs``, ``--out``, ``--plots`` (``plots`` names the files it draws) and ``--from``."""
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--plots", default=None, metavar="DIR", help=f"draw {plots} into DIR")
    p.add_argument("--from", dest="from_json", default=None, metavar="FILE",
                   help="run nothing: read a document this script wrote, print its tables (markdown) and draw --plots")


def known_names(p: argparse.ArgumentParser, flag: str, value: str, known: Collection[str]) -> list[str]:
    """The names of a comma list; a name not in ``known`` is the parser's error naming the flag."""
    given = [x for x in value.split(",") if x]
    unknown = [x for x in given if x not in known]
    if unknown:
        p.error(f"{flag}: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    return given


def draw(plot_study: PlotStudy, doc: dict, folder: str) -> None:
    """The document's figures into ``folder``, each path on stderr."""
    for path in plot_study(doc, folder):
        print(f"plot written to {path}", file=sys.stderr)


def show_saved(a: argparse.Namespace, tables: Callable[[dict], str], plot_study: PlotStudy) -> bool:
    """With ``--from``: the saved document's tables on stdout, its figures drawn when ``--plots`` is given,
    and True (the script stops); without it, False."""
    if not a.from_json:
        return False
    with open(a.from_json) as fh:
        loaded = json.load(fh)
    print(tables(loaded))
    if a.plots:
        draw(plot_study, loaded, a.plots)
    return True


def emit(doc: dict, out: str | None) -> None:
    """The document as indented JSON on stdout, and in the file ``out`` when one is given."""
    text = json.dumps(doc, indent=1)
    print(text)
    if out:
        with open(out, "w") as fh:
            fh.write(text + "\n")


def publish(a: argparse.Namespace, doc: dict, plot_study: PlotStudy) -> None:
    """A finished study's document: emitted (stdout, ``--out``), its figures drawn into ``--plots``."""
    emit(doc, a.out)
    if a.plots:
        draw(plot_study, doc, a.plots)
