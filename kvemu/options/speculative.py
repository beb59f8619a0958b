"""Speculative decoding's flags, one definition for sim, sweep, replica, up and the Python API:
``--speculative-method ngram|eagle|mtp``, ``--num-speculative-tokens K`` and one acceptance model,
``--acceptance-rate P`` (position i accepted with P given i - 1 was, seeded by ``--seed``) or
``--acceptance-lengths FILE|a,b,c`` (the measured shares of steps accepting 0, 1, ... K drafts).

The values and their checks are the core's (``replica.core.sched.spec_decode``); this module only says how a
command line names them and turns them into the one setting the scheduler takes (``spec_decode``)."""

from __future__ import annotations

import argparse

from kvemu.options.option import Option
from replica.core.sched.spec_decode import METHODS, SpecDecode, check_spec, parse_lengths
from shared.errors import InputError

SPECULATIVE_METHOD = Option(
    "--speculative-method", "", metavar="METHOD",
    help=f"speculative decoding as vLLM runs it: {', '.join(METHODS)} (a decode step verifies K draft tokens a"
         " sequence and keeps the accepted ones plus one; docs/speculative.md); default: none")
NUM_SPECULATIVE_TOKENS = Option("--num-speculative-tokens", 0, type=int, metavar="K",
                                help="draft tokens a decode step verifies per sequence (K >= 1; needs"
                                     " --speculative-method)")
ACCEPTANCE_RATE = Option("--acceptance-rate", 0.0, type=float, metavar="P",
                         help="speculative decoding: draft position i is accepted with P given i - 1 was (P in"
                              " (0, 1]; drawn per request and step from --seed)")
ACCEPTANCE_LENGTHS = Option("--acceptance-lengths", "", metavar="FILE|a,b,c",
                            help="speculative decoding: a measured distribution of accepted drafts, the shares of"
                                 " steps accepting 0, 1, ..., K (at most K + 1 numbers summing to 1), as a comma"
                                 " list or a file of them")

SPECULATIVE_OPTIONS = (SPECULATIVE_METHOD, NUM_SPECULATIVE_TOKENS, ACCEPTANCE_RATE, ACCEPTANCE_LENGTHS)


def add_speculative_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    for option in SPECULATIVE_OPTIONS:
        option.add(p)


def spec_decode(args: argparse.Namespace) -> SpecDecode | None:
    """The setting the flags give (None: no speculative decoding); bad input refused in one line naming the flag."""
    method = getattr(args, "speculative_method", "") or ""
    k = getattr(args, "num_speculative_tokens", 0)
    rate = getattr(args, "acceptance_rate", 0.0) or 0.0
    lengths_text = getattr(args, "acceptance_lengths", "") or ""
    if not method:
        for flag, value in (("--num-speculative-tokens", k), ("--acceptance-rate", rate),
                            ("--acceptance-lengths", lengths_text)):
            if value:
                raise InputError(flag, "needs --speculative-method (ngram, eagle or mtp)")
        return None
    if not k:
        # 0 is the flag's default, not a value the user gave: say what to add rather than "got 0"
        raise InputError("--num-speculative-tokens", f"--speculative-method {method} needs it: the draft tokens a"
                                                     " step verifies, an integer >= 1 (e.g. 3)")
    lengths = parse_lengths(lengths_text) if lengths_text else ()
    check_spec(method, k, rate, lengths, flags=True)
    return SpecDecode(method, k, rate, lengths, seed=getattr(args, "seed", 0) or 0)


__all__ = ["ACCEPTANCE_LENGTHS", "ACCEPTANCE_RATE", "NUM_SPECULATIVE_TOKENS", "SPECULATIVE_METHOD",
           "SPECULATIVE_OPTIONS", "add_speculative_args", "spec_decode"]
