"""Running one command-line tool: user errors print one ``error:`` line and exit 2, never a traceback.

Each subcommand module exposes ``configure(parser)`` and ``run(args) -> int``; the ``kvemu``
console script (``python -m kvemu``, as every launcher starts the processes: ``python -m kvemu
replica``, ``python -m kvemu router``) runs them through here, so the processes never import the CLI
package.
"""

from __future__ import annotations

import argparse
import difflib
import errno
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import NoReturn

from shared.errors import InputError, KvemuError

# What a required group of flags gives, by a flag of it: named in the line that asks for one of them.
GROUP_MEANING = {"--capacity-blocks": "the KV capacity of each replica", "--trace": "the requests"}


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose mistakes are one ``error:`` line, as every other mistake is: what is
    wrong, the flag or command meant where one was misspelt (difflib), else where the full list is
    (``--help``), instead of a usage block of 40 lines above argparse's own line. Exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.explain(message)}\n")

    def explain(self, message: str) -> str:
        unknown = re.fullmatch(r"unrecognized arguments: (.*)", message)
        if unknown:
            flags = [f for p in self._parsers() for a in p._actions for f in a.option_strings]
            args = unknown.group(1).split()
            for arg in (a for a in args if a.startswith("-")):
                close = difflib.get_close_matches(arg.split("=", 1)[0], flags, n=1)
                if close:
                    return f"unknown flag {arg.split('=', 1)[0]}: did you mean {close[0]}?"
            return f"unrecognized argument{'s' if len(args) > 1 else ''} {' '.join(args)} ({self._help()})"
        names = [name for action in self._actions if isinstance(action, argparse._SubParsersAction)
                 for name in action.choices]
        if message == "the following arguments are required: COMMAND":
            return f"give a command, one of {', '.join(names)} ({self.prog} --help says what each does)"
        choice = re.fullmatch(r"argument COMMAND: invalid choice: '([^']*)'.*", message, re.S)
        if choice:
            close = difflib.get_close_matches(choice.group(1), names, n=1)
            hint = f"did you mean {close[0]}?" if close else f"one of {', '.join(names)}"
            return f"unknown command {choice.group(1)!r}: {hint}"
        group = re.fullmatch(r"one of the arguments (.*) is required", message)
        if group:
            flags = group.group(1).split()
            meaning = next((GROUP_MEANING[f] for f in flags if f in GROUP_MEANING), None)
            listed = ", ".join(flags[:-1]) + f" or {flags[-1]}" if len(flags) > 1 else flags[0]
            return f"give one of {listed}" + (f" ({meaning})" if meaning else "") + f"; {self._help()}"
        return f"{message} ({self._help()})"

    def _parsers(self) -> Iterator[argparse.ArgumentParser]:
        """This parser and its subcommands' (only the chosen one has flags: the others are never configured)."""
        yield self
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from Parser._parsers(sub)

    def _help(self) -> str:
        chosen = [p for p in self._parsers() if p is not self and len(p._actions) > 1]
        return f"{(chosen[0] if chosen else self).prog} --help lists every flag"


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
