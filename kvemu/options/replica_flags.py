"""The replica's own flags `kvemu up` also takes and hands to every replica: its eviction policy,
model and emulated clock, and the admin token (block size and matching: ``kvemu.options.matching``). Capacity, the GPU,
tiers and the backend have their own modules (``kvemu.options.limits``, ``shared.gpuargs``,
``kvemu.options.tiers``, ``kvemu.options.backend``)."""

from __future__ import annotations

from kvemu.options.option import Option

DEFAULT_POLICY = "lru"
DEFAULT_MODEL = "qwen3-coder-30b-a3b"

MODEL = Option("--model", DEFAULT_MODEL, help=f"model shape the cost model and KV bytes use (default {DEFAULT_MODEL})")
TIME_SCALE = Option("--time-scale", 1.0, type=float, help="wall seconds per emulated second (0 = no sleeping)")


def policy_option(help: str = f"eviction policy (default {DEFAULT_POLICY})") -> Option:
    return Option("--policy", DEFAULT_POLICY, help=help)


POLICY = policy_option()  # `kvemu replica` and `kvemu up` add it with the live policies' names in the help
ADMIN_TOKEN = Option("--admin-token", None, help="bearer token for a replica's /admin/* (or KVEMU_ADMIN_TOKEN)")
