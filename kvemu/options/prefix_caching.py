"""``--prefix-caching on|off``: vLLM's ``--enable-prefix-caching``, one definition for sim, sweep,
replica, up and demo.

on (the default, as vLLM's): blocks stay cached after their request ends and a later request that
asks for them hits them; requests running at the same time share the blocks they have in common.
off: vLLM without prefix caching. Each request's blocks are its own while it runs (two requests with
the same prompt hold two copies) and are freed when it ends; nothing is matched, so every block of
every prompt is computed, nothing is stored or reported to a router's index, and a host or SSD tier
would hold nothing (refused). ``replica.core.cache.pool.BlockPool.prefix_caching`` is the definition."""

from __future__ import annotations

import argparse

from kvemu.options.option import Option
from replica.core.build import DEFAULT_PREFIX_CACHING, check_prefix_caching
from replica.core.build import PREFIX_CACHING as CHOICES
from replica.core.tiers.stack import TierSettings
from shared.errors import InputError

PREFIX_CACHING = Option(
    "--prefix-caching", DEFAULT_PREFIX_CACHING, choices=CHOICES, track=True,  # --vllm-version fills it in if not given
    help="on: blocks stay cached and are shared between requests (vLLM --enable-prefix-caching); off: each request"
         f" computes and holds all of its own blocks, freed when it ends (hit ratio 0); default {DEFAULT_PREFIX_CACHING}"
         " (given, wins over --vllm-version)")


def prefix_caching_setting(args: argparse.Namespace, tiers: TierSettings | None = None,
                           backend: str | None = None) -> str:
    """The flag's value, checked. Refused in one line naming the flag: off with a lower tier (it would
    hold nothing), and off on a backend other than the emulated one (the torch backend keys its KV
    slots by block hash, so it would share what off must not)."""
    value = getattr(args, "prefix_caching", DEFAULT_PREFIX_CACHING)
    check_prefix_caching(value, tiers if tiers is not None else TierSettings(), "--prefix-caching")
    if value == "off" and backend not in (None, "emulated"):
        raise InputError("--prefix-caching", f"off runs on the emulated backend only, not --backend {backend}")
    return value
