"""``--requests-out FILE``: one JSON line per request (``loadgen.request_metrics``'s fields), for ``kvemu sim`` and
``kvemu replay`` alike, so a run recorded against a real server and its simulation compare line by line;
``--sessions-out FILE`` (``kvemu sim``): one JSON line per agent session, its task time and critical path
(``loadgen.critical_path``; ``kvemu replay --json`` carries the same rows)."""

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

SESSIONS_OUT = Option(
    "--sessions-out", None, metavar="FILE.jsonl",
    help="a trace with dependencies: write one JSON line per agent session that finished: session, task_s and its"
         " critical path's queue_s, prefill_s, decode_s, tool_s, other_s, requests, on_path, widest; docs/agentic.md")


def add_requests_out_arg(p: argparse.ArgumentParser, help: str | None = None) -> None:
    REQUESTS_OUT.add(p, help=help)


def requests_out(args, option: Option = REQUESTS_OUT) -> str | None:
    """The path ``--requests-out`` (or ``option``) names, once its folder is known to exist (checked before any
    work)."""
    path = getattr(args, option.dest, None)
    if not path:
        return None
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise InputError(option.flag, f"directory {parent} does not exist")
    if os.path.isdir(path):
        raise InputError(option.flag, f"{path} is a directory; give a file's path")
    return str(path)
