"""Running one command-line tool: user errors print one ``error:`` line and exit 2, never a traceback.

Each subcommand module exposes ``configure(parser)`` and ``run(args) -> int``; the ``kvemu``
console script and the processes' own ``python -m replica`` / ``python -m router`` entry
points both run them through here, so the processes never import the CLI package.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
from collections.abc import Callable
from types import ModuleType

from shared.errors import InputError, KvemuError


def run_parsed(run: Callable[[argparse.Namespace], int | None], args: argparse.Namespace) -> int:
    """Call a subcommand's ``run`` and turn what a user can cause into an exit status."""
    try:
        return int(run(args) or 0)
    except KvemuError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def run_module(module: ModuleType, prog: str, description: str, argv: list[str] | None = None) -> int:
    """A subcommand module as a program of its own (``python -m replica ...``)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    module.configure(parser)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return run_parsed(module.run, args)


def serve(run_app: Callable[[], None], host: str, port: int) -> None:
    """Run a server; a port in use or an address this host lacks is one line saying what to do."""
    try:
        run_app()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise KvemuError(f"port {port} on {host} is in use; pick another with --port, or stop what"
                             " listens there") from None
        if exc.errno in (errno.EADDRNOTAVAIL, errno.EACCES):
            raise KvemuError(f"cannot listen on {host}:{port} ({exc.strerror}); check --host and --port") from None
        raise


def check_outputs(args, flags=("--json", "--csv", "--plot")) -> None:
    """Before any work: every output's folder exists, and --plot has matplotlib."""
    for flag in flags:
        path = getattr(args, flag.lstrip("-"), None)
        if not path or path == "-":
            continue
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise InputError(flag, f"directory {parent} does not exist")
    if getattr(args, "plot", None):
        from shared.plotting import require_matplotlib

        require_matplotlib()
