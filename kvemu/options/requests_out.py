"""``--requests-out FILE``: one JSON line per request (``loadgen.request_metrics``'s fields), for ``kvemu sim`` and
``kvemu replay`` alike, so a run recorded against a real server and its simulation compare line by line."""

from __future__ import annotations

import argparse
import os

from kvemu.options.option import Option
from shared.errors import InputError

REQUESTS_OUT = Option(
    "--requests-out", None, metavar="FILE.jsonl",
    help="write one JSON line per request: index (its place in the trace), arrival_s, first_token_s, finish_s,"
         " input_tokens, output_tokens, cached_tokens, preemptions, replica (null where unknown or never run);"
         " docs/tour.md")


def add_requests_out_arg(p: argparse.ArgumentParser, help: str | None = None) -> None:
    REQUESTS_OUT.add(p, help=help)


def requests_out(args) -> str | None:
    """The path ``--requests-out`` names, once its folder is known to exist (checked before any work)."""
    path = getattr(args, REQUESTS_OUT.dest, None)
    if not path:
        return None
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise InputError(REQUESTS_OUT.flag, f"directory {parent} does not exist")
    if os.path.isdir(path):
        raise InputError(REQUESTS_OUT.flag, f"{path} is a directory; give a file's path")
    return str(path)
