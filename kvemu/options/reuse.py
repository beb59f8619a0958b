"""Reuse-distance flags: which miss-ratio curve a run tracks (``--reuse`` on sim, ``--reuse-distances``
on sweep) and the live replica's SHARDS sampling rate (``--shards-rate``).

One vocabulary: "sampled" is SHARDS sampling (Waldspurger et al., "Efficient MRC Construction
with SHARDS", FAST 2015) at the shards rate, in the core, the simulator and on every flag."""

from __future__ import annotations

import argparse

from kvemu.options.option import Option
from replica.core.build import DEFAULT_SHARDS_RATE, SIM_REUSE_MODES

REUSE = Option("--reuse", "auto", choices=SIM_REUSE_MODES,
               help="reuse distances for the miss-ratio curve: SHARDS-sampled (within 0.01 of exact), exact, or off"
                    " (fastest); auto (default) = sampled, or off with --cache-only; the JSON says which")
SHARDS_RATE = Option("--shards-rate", DEFAULT_SHARDS_RATE, type=float,
                     help=f"sampling rate of online reuse distances (default {DEFAULT_SHARDS_RATE:g})")


def add_sim_reuse_args(p: argparse.ArgumentParser) -> None:
    """``kvemu sim``: ``--reuse MODE`` and its older spelling of ``--reuse off``."""
    REUSE.add(p)
    p.add_argument("--no-reuse-distances", action="store_true", help="same as --reuse off")


def add_sweep_reuse_arg(p: argparse.ArgumentParser) -> None:
    """``kvemu sweep``: off unless asked for, then exact (a sweep's grid points are compared, not sampled)."""
    p.add_argument("--reuse-distances", action="store_true",
                   help="track exact reuse distances in every run (slower; off by default)")


def sim_reuse(args: argparse.Namespace) -> str:
    """The ``SimSettings.reuse`` a sim command line asks for."""
    return "off" if args.no_reuse_distances else args.reuse


def sweep_reuse(args: argparse.Namespace) -> str:
    """The ``SimSettings.reuse`` of every point of a sweep."""
    return "exact" if args.reuse_distances else "off"
