"""``--response-kv``: whether a finished request's response blocks stay cached for the next turn.

One default for every command (sim, sweep, replica, up, demo) and every settings class: ``keep``,
what a colocated vLLM does (its prefix cache holds the KV of each response's full blocks, so the
next turn of the conversation hits them). ``drop`` models a disaggregated prefill instance, which
never sees the decode's KV. Figures made while sim and sweep dropped response KV by default are
reproduced with ``--response-kv drop``."""

from __future__ import annotations

import argparse

from kvemu.options.option import Option
from replica.core.build import DEFAULT_RESPONSE_KV, RESPONSE_KV

RESPONSE_KV_OPTION = Option(
    "--response-kv", DEFAULT_RESPONSE_KV, choices=RESPONSE_KV,
    help=f"keep: cache each response's full blocks so the next turn hits them (a colocated vLLM); drop: do not, the"
         f" next turn recomputes them (a disaggregated prefill instance); default {DEFAULT_RESPONSE_KV}")


def add_response_kv_arg(p: argparse.ArgumentParser) -> None:
    RESPONSE_KV_OPTION.add(p)
