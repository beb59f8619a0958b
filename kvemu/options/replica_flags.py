"""The replica's own flags `kvemu up` also takes and hands to every replica: its eviction policy,
model, block size and emulated clock. Capacity, the GPU, tiers and the backend have their own
modules (a mutually exclusive pair, ``shared.gpuargs``, ``kvemu.options.tiers``, ``replica.backends``)."""

from __future__ import annotations

from kvemu.options.option import Option

DEFAULT_POLICY = "lru"
DEFAULT_MODEL = "qwen3-coder-30b-a3b"

MODEL = Option("--model", DEFAULT_MODEL, help=f"model shape the cost model and KV bytes use (default {DEFAULT_MODEL})")
BLOCK_SIZE = Option("--block-size", 16, type=int, help="tokens per KV block (default 16)")
TIME_SCALE = Option("--time-scale", 1.0, type=float, help="wall seconds per emulated second (0 = no sleeping)")


def policy_option(help: str = f"eviction policy (default {DEFAULT_POLICY})") -> Option:
    return Option("--policy", DEFAULT_POLICY, help=help)
