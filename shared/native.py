"""kvemu's C extensions, loaded where they were built and match their source.

Three C extensions (``setup.py``, built at install when a C compiler is present) speed kvemu up:
``replica.core.compiled._pool`` (the simulator's block pool with LRU, S3-FIFO, Belady or
BeladyCompute, ``replica.core.compiled.pool``), ``replica.core.compiled._lru_stack`` (SHARDS's
exact LRU stack, ``replica.core.analysis.lru_stack``) and ``loadgen._traceread`` (a well-formed
JSON-lines trace's columns, ``loadgen.jsonlines.typed_columns``). Each has a Python definition it is
tested against, used wherever the extension is missing. A module carries the SHA-256 of the source
it was built from: in a checkout whose source changed since the last install, the stale build is not
used. This module needs only the standard library (``setup.py`` loads it by path).
"""

from __future__ import annotations

import hashlib
import importlib
from pathlib import Path
from types import ModuleType

__all__ = ["SOURCES", "load", "source_digest"]

ROOT = Path(__file__).resolve().parent.parent  # the repository (or site-packages) root

# Each C extension's source files, relative to the root: what its SHA-256 covers, the first its C file
# (setup.py reads this table too).
SOURCES = {
    "replica.core.compiled._pool": ("replica/core/compiled/_pool.c", "replica/core/compiled/_belady_compute.h"),
    "replica.core.compiled._lru_stack": ("replica/core/compiled/_lru_stack.c",),
    "loadgen._traceread": ("loadgen/_traceread.c",),
}


def source_digest(root: Path, name: str) -> str:
    """SHA-256 over the module's source files, in order."""
    h = hashlib.sha256()
    for file in SOURCES[name]:
        h.update((root / file).read_bytes())
    return h.hexdigest()


def load(name: str) -> tuple[ModuleType | None, str]:
    """The extension ``name`` (a dotted module name, a key of ``SOURCES``) and "", or None and why it
    is not used."""
    try:
        module = importlib.import_module(name)
    except ImportError:
        return None, f"{name} is not built (no C compiler at install)"
    if (ROOT / SOURCES[name][0]).exists() and source_digest(ROOT, name) != module.SOURCE_SHA256:
        return None, f"{name} is older than its C source (run `pip install -e .` again)"
    return module, ""
