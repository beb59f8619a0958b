"""The knobs every process's core shares (``replica.core.build.EngineKnobs``) built from a command's parsed flags:
the one function kvemu sim, sweep, replica and up call (the Python API builds the same record from its keywords).

The record checks its fields itself; a command re-raises its refusal naming the flag a user typed, through the
one table below (``FLAGS``). A new knob is a field of ``EngineKnobs``, its flag's ``Option`` and, where its flag
is not the field's name spelled as a flag, a line of ``FLAGS``."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager

from kvemu.options.matching import Matching
from kvemu.options.speculative import spec_decode
from replica.core.build import DEFAULT_SHARDS_RATE, EngineKnobs
from replica.core.tiers.stack import TierSettings
from shared.errors import InputError
from shared.overrides import coerce, parse_pairs

NO_TIERS = TierSettings()
# A field's flag where it is not ``--`` and the field's name with dashes (less a seconds suffix ``_s``)
FLAGS = {
    "policy_params": "--policy-param",
    "decode_kv": "--no-decode-kv",
}


def flag_of(field: str) -> str:
    """The flag that sets ``field`` (a knob's, or any settings field a command line sets)."""
    if field.startswith("--"):
        return field
    return FLAGS.get(field) or f"--{field.removesuffix('_s').replace('_', '-')}"


@contextmanager
def naming_flags() -> Iterator[None]:
    """A settings record's refusal (an ``InputError`` naming its field), re-raised naming the field's flag."""
    try:
        yield
    except InputError as exc:
        raise InputError(flag_of(exc.field), exc.message) from None


def policy_params(args: argparse.Namespace) -> tuple[tuple[str, object], ...]:
    """``--policy-param NAME=VALUE``, each value read as a number or a word (none where a command has no such flag)."""
    return tuple((k, coerce(v)) for k, v in parse_pairs(getattr(args, "policy_param", None) or []).items())


def engine_knobs(args: argparse.Namespace, matching: Matching, tiers: TierSettings = NO_TIERS,
                 policy: str | None = None) -> EngineKnobs:
    """The knobs the flags ask for, checked, a refusal naming its flag. ``policy``: one of sim's and sweep's
    comma-separated ``--policy`` (default: ``--policy`` itself); ``tiers``: the levels below HBM, as the command
    sized them. ``--no-decode-kv`` and ``--seed`` are sim's and sweep's, ``--shards-rate`` the live replica's:
    without the flag, the record's default."""
    with naming_flags():
        return EngineKnobs(
            policy=policy or args.policy, policy_params=policy_params(args), hit_mode=matching.hit_mode,
            matching=matching.mode, token_budget=args.token_budget, max_running=args.max_running,
            scheduler=args.scheduler, watermark=args.watermark, step_rule=args.step_rule, max_loans=args.max_loans,
            decode_kv=not getattr(args, "no_decode_kv", False), response_kv=args.response_kv,
            prefix_caching=args.prefix_caching, tiers=tiers, shards_rate=getattr(args, "shards_rate", DEFAULT_SHARDS_RATE),
            seed=getattr(args, "seed", 0), speculative=spec_decode(args))


def check_scheduler_knobs(args: argparse.Namespace) -> None:
    """The scheduler's flags checked by the record before anything is read or sized (a trace can take a while):
    the others at their defaults, which the record takes."""
    with naming_flags():
        EngineKnobs(token_budget=args.token_budget, max_running=args.max_running, scheduler=args.scheduler,
                    watermark=args.watermark, step_rule=args.step_rule, max_loans=args.max_loans)
