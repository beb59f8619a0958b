"""The replica's own flags `kvemu up` also takes and hands to every replica: its eviction policy,
model and emulated clock, and the admin token (which up hands on in the environment; block size and
matching: ``kvemu.options.matching``). Capacity, the GPU, tiers and the backend have their own modules
(``kvemu.options.limits``, ``kvemu.options.gpu``, ``kvemu.options.tiers``, ``kvemu.options.backend``)."""

from __future__ import annotations

import os

from kvemu.options.option import Option

DEFAULT_POLICY = "lru"
DEFAULT_MODEL = "qwen3-coder-30b-a3b"

MODEL = Option("--model", DEFAULT_MODEL, help=f"model shape the cost model and KV bytes use (default {DEFAULT_MODEL})")
TIME_SCALE = Option("--time-scale", 1.0, type=float, help="wall seconds per emulated second (0 = no sleeping)")


def policy_option(help: str = f"eviction policy (default {DEFAULT_POLICY})") -> Option:
    return Option("--policy", DEFAULT_POLICY, help=help)


POLICY = policy_option()  # `kvemu replica` and `kvemu up` add it with the live policies' names in the help
ADMIN_TOKEN_ENV = "KVEMU_ADMIN_TOKEN"
# A value on a command line is readable by every local user (/proc/PID/cmdline, ps): `kvemu up` hands
# the token to its replicas in the environment (readable by their owner only), as the cluster token.
ADMIN_TOKEN = Option("--admin-token", None,
                     help=f"bearer token for a replica's /admin/* (default: {ADMIN_TOKEN_ENV}); warning: a token on a"
                          " command line is readable by every user of this host (ps, /proc/PID/cmdline): prefer"
                          f" {ADMIN_TOKEN_ENV} in the environment, as `kvemu up` hands it to its replicas")


def given_admin_token(args) -> str | None:
    """The token given (``--admin-token``), else the environment's; None: the admin endpoints are off."""
    return getattr(args, "admin_token", None) or os.environ.get(ADMIN_TOKEN_ENV) or None
