"""A replica's scheduler flags: ``--scheduler`` (the admission order), ``--token-budget``,
``--max-running``, ``--max-waiting``, ``--watermark``, ``--step-rule`` and ``--vllm-version`` (which fills
in the others from a vLLM release's rules: kvemu/options/vllm_version.py), one definition for sim, sweep,
replica and up.

The values and their checks are the core's (``replica.core.sched.sched_types``); this module
only says how a command line names them."""

from __future__ import annotations

import argparse

from kvemu.options.knobs import check_scheduler_knobs
from kvemu.options.option import Option
from kvemu.options.vllm_version import VLLM_VERSION, apply_vllm_version
from replica.core.sched.sched_types import (
    ADMISSIONS,
    DEFAULT_ADMISSION,
    DEFAULT_MAX_LOANS,
    DEFAULT_MAX_RUNNING,
    DEFAULT_MAX_WAITING,
    DEFAULT_TOKEN_BUDGET,
    DEFAULT_WATERMARK,
    VLLM_V0_WATERMARK,
)
from replica.core.sched.v0_steps import DEFAULT_STEP_RULE, STEP_RULES
from shared.errors import InputError

SCHEDULER = Option(
    "--scheduler", DEFAULT_ADMISSION,
    help=f"admission order: fcfs (vLLM) or reorder (FlashGen, Jeong and Ahn, ASPLOS 2025: requests behind a head"
         f" that does not fit borrow the idle KV memory and are preempted as soon as the head could run);"
         f" default {DEFAULT_ADMISSION}")
# track: --vllm-version fills in the ones not given
TOKEN_BUDGET = Option("--token-budget", DEFAULT_TOKEN_BUDGET, type=int, track=True,
                      help=f"tokens per scheduler step (default {DEFAULT_TOKEN_BUDGET}; given, wins over --vllm-version)")
MAX_RUNNING = Option("--max-running", DEFAULT_MAX_RUNNING, type=int, track=True,
                     help=f"requests running at once per replica (1 = the cache sees requests one at a time;"
                          f" default {DEFAULT_MAX_RUNNING}; given, wins over --vllm-version)")
MAX_WAITING = Option("--max-waiting", DEFAULT_MAX_WAITING, type=int,
                     help=f"requests a replica queues; beyond, 503 + Retry-After (default {DEFAULT_MAX_WAITING:,})")

WATERMARK = Option("--watermark", DEFAULT_WATERMARK, type=float, metavar="F", track=True,
                   help=f"admit a request only if this fraction of the KV blocks stays free after it (vLLM v0's"
                        f" block manager, the vLLM FlashGen compares against, uses {VLLM_V0_WATERMARK}; vLLM v1 has"
                        f" none; default {DEFAULT_WATERMARK:g}; given, wins over --vllm-version)")
MAX_LOANS = Option("--max-loans", DEFAULT_MAX_LOANS, type=int, metavar="N",
                   help=f"--scheduler reorder: times one request may be admitted ahead of its turn (each loan may end"
                        f" in a preemption; default {DEFAULT_MAX_LOANS})")

STEP_RULE = Option("--step-rule", DEFAULT_STEP_RULE, choices=STEP_RULES, track=True,
                   help=f"what one step runs: v1 (vLLM today: decodes and chunked prefills in one forward, admission"
                        f" by memory) or v0 (vLLM v0, the FlashGen paper's baseline: a step prefills whole prompts or"
                        f" decodes, never both, prefills first while a waiting prompt fits the --token-budget and"
                        f" --max-running); default {DEFAULT_STEP_RULE} (given, wins over --vllm-version)")

# What every scheduler a command runs takes; the simulator sizes its queue to the trace instead
# of --max-waiting (virtual time refuses nothing).
SIM_SCHEDULER_OPTIONS = (TOKEN_BUDGET, MAX_RUNNING, SCHEDULER, WATERMARK, MAX_LOANS, STEP_RULE, VLLM_VERSION)
LIVE_SCHEDULER_OPTIONS = (*SIM_SCHEDULER_OPTIONS, MAX_WAITING)


def add_scheduler_args(p: argparse.ArgumentParser, live: bool) -> None:
    for option in LIVE_SCHEDULER_OPTIONS if live else SIM_SCHEDULER_OPTIONS:
        option.add(p)


def check_scheduler_flags(args: argparse.Namespace) -> None:
    """First the settings ``--vllm-version`` gives where their flags were not given (one line on stderr
    says which); then the values, as the knobs' record checks them (``EngineKnobs``), and ``--max-loans`` is not
    given where nothing is lent (the errors name the flags)."""
    apply_vllm_version(args)
    check_scheduler_knobs(args)
    if args.max_loans != MAX_LOANS.default and args.scheduler != "reorder":
        raise InputError("--max-loans", f"does nothing with --scheduler {args.scheduler} (nothing is admitted ahead of"
                                        " its turn): add --scheduler reorder, or drop it")


__all__ = ["ADMISSIONS", "LIVE_SCHEDULER_OPTIONS", "MAX_LOANS", "SCHEDULER", "STEP_RULE", "VLLM_VERSION", "WATERMARK",
           "SIM_SCHEDULER_OPTIONS",
           "add_scheduler_args",
           "check_scheduler_flags"]
