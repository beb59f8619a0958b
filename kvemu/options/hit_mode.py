"""``--hit-mode``: which cached blocks of a prompt count as hits (sim, sweep, replica, up)."""

from __future__ import annotations

from kvemu.options.option import Option
from replica.core.build import DEFAULT_HIT_MODE
from replica.core.cache.pool import HIT_MODES

HIT_MODE = Option("--hit-mode", DEFAULT_HIT_MODE, choices=HIT_MODES,
                  help=f"prefix: only a prompt's leading run of cached blocks is reused (vLLM, SGLang); holes: every"
                       f" cached block is, the gaps between them recomputed (default {DEFAULT_HIT_MODE})")
