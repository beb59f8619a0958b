"""The compiled parts of the cache core, loaded where they were built and match their source.

Two C extensions (``setup.py``, built at install when a C compiler is present) speed up the
simulator: ``_pool`` (the block pool with LRU, S3-FIFO, Belady or BeladyCompute,
``replica.core.compiled.pool``) and ``_lru_stack`` (SHARDS's exact LRU stack,
``replica.core.analysis.lru_stack``). Each has a Python definition it is tested against, used
wherever the extension is missing. A module carries the SHA-256 of the source it was built from: in
a checkout whose source changed since the last install, the stale build is not used.
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path
from types import ModuleType

__all__ = ["load"]


# Each compiled module's source files: what its SHA-256 covers (setup.py reads this table too).
SOURCES = {"_pool": ("_pool.c", "_belady_compute.h"), "_lru_stack": ("_lru_stack.c",)}


def source_digest(folder: Path, name: str) -> str:
    """SHA-256 over the module's source files, in order."""
    h = hashlib.sha256()
    for file in SOURCES[name]:
        h.update((folder / file).read_bytes())
    return h.hexdigest()


def load(name: str) -> tuple[ModuleType | None, str]:
    """``replica.core.compiled.<name>`` and "", or None and why it is not used."""
    try:
        module = importlib.import_module(f"replica.core.compiled.{name}")
    except ImportError:
        return None, f"replica.core.compiled.{name} is not built (no C compiler at install)"
    here = Path(__file__).parent
    if (here / SOURCES[name][0]).exists() and source_digest(here, name) != module.SOURCE_SHA256:
        return None, f"replica.core.compiled.{name} is older than its C source (run `pip install -e .` again)"
    return module, ""
