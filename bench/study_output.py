"""What a study script (bench_pd.py, bench_shared_pool.py, bench_step_cost.py) prints and keeps: its JSON
document on stdout and in ``--out``, and ``--from``, which reads a saved document back to print its tables
and draw its plots without running anything.

Imported as ``bench.study_output``: a script puts the repository root on ``sys.path`` first.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable


def add_study_flags(p: argparse.ArgumentParser, plots: str) -> None:
    """``--jobs``, ``--out``, ``--plots`` (``plots`` names the files it draws) and ``--from``."""
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.add_argument("--plots", default=None, metavar="DIR", help=f"draw {plots} into DIR")
    p.add_argument("--from", dest="from_json", default=None, metavar="FILE",
                   help="run nothing: read a document this script wrote, print its tables (markdown) and draw --plots")


def show_saved(a: argparse.Namespace, tables: Callable[[dict], str], draw: Callable[[dict, str], None]) -> bool:
    """With ``--from``: the saved document's tables on stdout, its plots drawn when ``--plots`` is given,
    and True (the script stops); without it, False."""
    if not a.from_json:
        return False
    with open(a.from_json) as fh:
        loaded = json.load(fh)
    print(tables(loaded))
    if a.plots:
        draw(loaded, a.plots)
    return True


def emit(doc: dict, out: str | None) -> None:
    """The document as indented JSON on stdout, and in the file ``out`` when one is given."""
    text = json.dumps(doc, indent=1)
    print(text)
    if out:
        with open(out, "w") as fh:
            fh.write(text + "\n")
