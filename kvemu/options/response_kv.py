"""``--response-kv``: whether a finished request's response blocks stay cached for the next turn.

The live commands (replica, up, demo) keep them, as a colocated vLLM does; sim and sweep drop
them, as a disaggregated prefill instance does and as the figures in docs/ were made. Which one
a command defaults to is decided elsewhere; both defaults are named here once."""

from __future__ import annotations

import argparse

from kvemu.options.option import Option
from replica.core.build import RESPONSE_KV

LIVE_DEFAULT = "keep"  # replica, up, demo (ReplicaSettings.response_kv)
SIM_DEFAULT = "drop"  # sim, sweep (SimSettings.response_kv)

_HELP = ("keep: cache each response's full blocks so the next turn hits them (a colocated vLLM); drop: do not, the"
         " next turn recomputes them (a disaggregated prefill instance)")


def response_kv_option(default: str) -> Option:
    return Option("--response-kv", default, choices=RESPONSE_KV, help=f"{_HELP}; default {default}")


RESPONSE_KV_LIVE = response_kv_option(LIVE_DEFAULT)
RESPONSE_KV_SIM = response_kv_option(SIM_DEFAULT)


def add_response_kv_arg(p: argparse.ArgumentParser, live: bool) -> None:
    (RESPONSE_KV_LIVE if live else RESPONSE_KV_SIM).add(p)
