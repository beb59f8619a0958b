"""``--arrivals dependent|recorded``: when an agent's requests arrive, one definition for ``kvemu sim`` and
``kvemu replay``. ``dependent`` (the default for a trace whose lines wait for others): a request that waits
(``after``) arrives when the last of what it waits for has finished, plus its ``gap_s``, on the simulated clock
or against a live cluster alike; ``recorded``: every request of such a session at its trace time. A session with
no dependencies behaves the same either way. The rule itself is ``loadgen.arrivals.Arrivals``."""

from __future__ import annotations

import argparse

from kvemu.options.option import Option

CHOICES = ("dependent", "recorded")

ARRIVALS = Option(
    "--arrivals", None, choices=CHOICES,
    help="dependent: a request that waits for others (a trace's `after`) arrives when they have finished plus its"
         " gap_s, as an agent sends it; recorded: at its trace time, as recorded (default: dependent where the trace"
         " has dependencies; a session without them is sent as before either way)")


def add_arrivals_arg(p: argparse.ArgumentParser) -> None:
    ARRIVALS.add(p)


def arrivals_mode(args: argparse.Namespace, dependencies: bool) -> str:
    """The flag's value, or where it is not given, ``dependent`` for a trace with dependencies
    (``loadgen.trace.has_dependencies``) and ``recorded`` for one without (the same arrivals: nothing waits)."""
    given = getattr(args, ARRIVALS.dest, None)
    if given is not None:
        return str(given)
    return "dependent" if dependencies else "recorded"
