"""The replica's own flags `kvemu up` also takes and hands to every replica: its eviction policy,
model and emulated clock, and the admin token (which up hands on in the environment; block size and
matching: ``kvemu.options.matching``). Capacity, the GPU, tiers and the backend have their own modules
(``kvemu.options.limits``, ``kvemu.options.gpu``, ``kvemu.options.tiers``, ``kvemu.options.backend``)."""

from __future__ import annotations

import os

from kvemu.options.option import Option
from shared.hf_config import is_config_path
from shared.model_presets import model_preset

DEFAULT_POLICY = "lru"
DEFAULT_MODEL = "qwen3-coder-30b-a3b"


def model_arg(value: str) -> str:
    """A preset name as given; a config.json path made absolute, so a child started elsewhere reads the
    same file (the file itself is read and checked where the command builds its cost model)."""
    if model_preset(value) is not None or not is_config_path(value):
        return value
    return os.path.abspath(value)


MODEL = Option("--model", DEFAULT_MODEL, type=model_arg, metavar="NAME|CONFIG.json",
               help="model shape the cost model and KV bytes use: a preset (llama-3.1-8b, qwen3-32b, qwen3-30b-a3b,"
                    f" deepseek-v3, gpt-oss-120b, gemma-3-27b, ...; default {DEFAULT_MODEL}) or a Hugging Face"
                    " config.json, or the folder holding it")
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
