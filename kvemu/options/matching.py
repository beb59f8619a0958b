"""``--matching blocks|radix``, ``--page-size P``, ``--block-size N`` and ``--hit-mode``: how a prompt is
matched against the cache, one definition for sim, sweep, replica and up.

blocks (the default, vLLM's): chained hashes of full blocks of ``--block-size`` tokens (16); a partial
last block is never reused. radix (SGLang's): the longest common token prefix, rounded down to whole
pages of ``--page-size`` tokens (1 by default: to the exact token where two prompts part); a partial page
is not shared; only leaves are evicted (``replica.core.build.check_matching`` says how the block pool
is that tree, and why only LRU carries over). Radix matching needs the tokens: a request or a trace
that carries only block hashes cannot be re-cut into pages.

Each flag that would do nothing is refused: ``--page-size`` without radix, ``--block-size`` with it.
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import dataclass

from kvemu.options.option import Option
from replica.core.build import DEFAULT_HIT_MODE, DEFAULT_MATCHING, DEFAULT_PAGE_SIZE, MATCHING
from replica.core.cache.pool import HIT_MODES
from shared.errors import InputError
from shared.hashing import DEFAULT_BLOCK_SIZE

MATCHING_OPTION = Option(
    "--matching", DEFAULT_MATCHING, choices=MATCHING,
    help="blocks: vLLM's chained hashes of full blocks of --block-size tokens; radix: SGLang's radix tree, the"
         " longest common token prefix in whole pages of --page-size tokens (needs token ids: refused for"
         f" traces of block hashes; LRU only); default {DEFAULT_MATCHING}")
PAGE_SIZE = Option("--page-size", None, type=int, metavar="P",
                   help=f"with --matching radix: tokens per page (default {DEFAULT_PAGE_SIZE}, SGLang's)")
BLOCK_SIZE = Option("--block-size", None, type=int, metavar="N",
                    help=f"with --matching blocks: tokens per KV block (default {DEFAULT_BLOCK_SIZE})")
HIT_MODE = Option("--hit-mode", None, choices=HIT_MODES,
                  help=f"prefix: only a prompt's leading run of cached blocks is reused (vLLM, SGLang); holes: every"
                       " cached block is, the gaps between them recomputed (the \"When Fancy Eviction Fails\""
                       f" analysis' count; --matching blocks only); default {DEFAULT_HIT_MODE}, vLLM's")
MATCHING_OPTIONS = (MATCHING_OPTION, PAGE_SIZE, BLOCK_SIZE, HIT_MODE)


@dataclass(frozen=True, slots=True)
class Matching:
    """What the flags resolve to: the mode, the hashing unit (the page size under radix) and the hit mode."""

    mode: str
    block_size: int
    hit_mode: str

    @property
    def label(self) -> str:
        """``blocks-16``, ``radix-1``: what a figure or a table calls it."""
        return f"{self.mode}-{self.block_size}"


def add_matching_args(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    for option in MATCHING_OPTIONS:
        option.add(p)


def _size(flag: str, value: int) -> int:
    if not 1 <= value <= 1 << 20:
        raise InputError(flag, f"must be a whole number of tokens from 1 to {1 << 20}, got {value}")
    return value


def source_unit(args: argparse.Namespace, matching: Matching) -> int | None:
    """The block size to cut a source's tokens into (presets, request logs): the page size under radix,
    ``--block-size`` where given or the model's served block where state layers raise it; None: the source's own
    (a trace of hashes keeps its block size)."""
    if matching.mode == "radix" or getattr(args, "block_size", None) is not None:
        return matching.block_size
    if matching.block_size != DEFAULT_BLOCK_SIZE:  # raised for the model's state layers: its blocks are the unit
        return matching.block_size
    return None


def matching_setting(args: argparse.Namespace) -> Matching:
    """The four flags as one checked ``Matching`` (the policy-dependent rules are ``check_matching``'s)."""
    mode = getattr(args, "matching", DEFAULT_MATCHING) or DEFAULT_MATCHING
    page, block = getattr(args, "page_size", None), getattr(args, "block_size", None)
    hit_mode = getattr(args, "hit_mode", None)
    if mode == "radix":
        if block is not None:
            raise InputError("--block-size", "is the blocks mode's unit; with --matching radix give --page-size")
        if hit_mode == "holes":
            raise InputError("--hit-mode", "holes has no meaning in a radix tree (a match is a leading run of"
                                           " pages): drop it or use --matching blocks")
        return Matching(mode, _size("--page-size", DEFAULT_PAGE_SIZE if page is None else page), "prefix")
    if page is not None:
        raise InputError("--page-size", "would do nothing with --matching blocks: add --matching radix, or give"
                                        " --block-size")
    asked = _size("--block-size", DEFAULT_BLOCK_SIZE if block is None else block)
    return Matching(mode, served_block_size(args, asked), hit_mode or DEFAULT_HIT_MODE)


def served_block_size(args: argparse.Namespace, block_size: int) -> int:
    """The block the model is served at, the one unit of hashing, capacity and the core alike: ``block_size``,
    raised for state layers as vLLM raises it (CostModel.kv_block_size: 544 tokens for Qwen3-Next at --tp 2).
    A --model or --gpu kvemu cannot read is left to the check that names it."""
    model, gpu = getattr(args, "model", None), getattr(args, "gpu", None)
    if not isinstance(model, str) or not isinstance(gpu, str):
        return block_size
    return _served_block(model, getattr(args, "kv_cache_dtype", "auto") or "auto", gpu, getattr(args, "tp", 1),
                         block_size)


@functools.lru_cache(maxsize=16)
def _served_block(model: str, kv_cache_dtype: str, gpu: str, tp: object, block_size: int) -> int:
    """``served_block_size`` of the flags' values, once per command: every caller of ``matching_setting`` asks,
    and a config.json model or a device profile is a file read."""
    from kvemu.options.gpu import gpu_setting
    from kvemu.options.kv_cache_dtype import model_setting
    from shared.costmodel import CostModel
    flags = argparse.Namespace(model=model, kv_cache_dtype=kv_cache_dtype, gpu=gpu, tp=tp)
    try:
        return CostModel.from_names(model_setting(flags), gpu_setting(flags)).kv_block_size(block_size)
    except (InputError, ValueError, OSError):
        return block_size

