"""A replica's scheduler flags: ``--scheduler`` (the admission order), ``--token-budget``,
``--max-running`` and ``--max-waiting``, one definition for sim, sweep, replica and up.

The values and their checks are the core's (``replica.core.sched.sched_types``); this module
only says how a command line names them."""

from __future__ import annotations

import argparse

from kvemu.options.option import Option
from replica.core.sched.sched_types import (
    ADMISSIONS,
    DEFAULT_ADMISSION,
    DEFAULT_MAX_RUNNING,
    DEFAULT_MAX_WAITING,
    DEFAULT_TOKEN_BUDGET,
    check_admission,
)

SCHEDULER = Option(
    "--scheduler", DEFAULT_ADMISSION,
    help=f"admission order: fcfs (vLLM) or reorder (FlashGen, Jeong and Ahn, ASPLOS 2025: requests behind a head"
         f" that does not fit borrow the idle KV memory and are preempted as soon as the head could run);"
         f" default {DEFAULT_ADMISSION}")
TOKEN_BUDGET = Option("--token-budget", DEFAULT_TOKEN_BUDGET, type=int,
                      help=f"tokens per scheduler step (default {DEFAULT_TOKEN_BUDGET})")
MAX_RUNNING = Option("--max-running", DEFAULT_MAX_RUNNING, type=int,
                     help=f"requests running at once per replica (1 = the cache sees requests one at a time;"
                          f" default {DEFAULT_MAX_RUNNING})")
MAX_WAITING = Option("--max-waiting", DEFAULT_MAX_WAITING, type=int,
                     help=f"requests a replica queues; beyond, 503 + Retry-After (default {DEFAULT_MAX_WAITING:,})")

# What every scheduler a command runs takes; the simulator sizes its queue to the trace instead
# of --max-waiting (virtual time refuses nothing).
SIM_SCHEDULER_OPTIONS = (TOKEN_BUDGET, MAX_RUNNING, SCHEDULER)
LIVE_SCHEDULER_OPTIONS = (*SIM_SCHEDULER_OPTIONS, MAX_WAITING)


def add_scheduler_args(p: argparse.ArgumentParser, live: bool) -> None:
    for option in LIVE_SCHEDULER_OPTIONS if live else SIM_SCHEDULER_OPTIONS:
        option.add(p)


def check_scheduler_flag(name: str) -> None:
    """``--scheduler``'s value names an admission order (the error names the flag)."""
    check_admission(name, "--scheduler")


__all__ = ["ADMISSIONS", "LIVE_SCHEDULER_OPTIONS", "SCHEDULER", "SIM_SCHEDULER_OPTIONS", "add_scheduler_args",
           "check_scheduler_flag"]
