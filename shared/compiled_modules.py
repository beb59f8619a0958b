"""The scheduler step and the simulator's loop, compiled from their one Python source by mypyc.

``MODULES`` are compiled at install (``setup.py``, when mypyc and a C compiler are there;
``KVEMU_MYPYC=0`` skips it) into extension modules beside their sources. Python would then import
the extension before the source, so an edited source would be shadowed by an old build: a finder on
``sys.meta_path`` (installed by ``shared``, ``sim`` and ``replica.core.sched`` before any of these
is imported) makes the one decision of which runs. The build runs only where ``DIGEST_FILE`` records
the digest of exactly the sources it was built from (written after every module compiled); otherwise,
or with ``KVEMU_INTERPRETED=1``, every module of the set loads from source (all or none: compiled
modules call each other directly, so one stale module would leak into the others). ``status()`` says
which ran; the equivalence tests run both and compare every field of ``kvemu sim``'s JSON.

Stdlib only: ``setup.py`` loads this file by path.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path

# In dependency order: mypyc compiles them as one group.
MODULES = (
    "shared.histogram",
    "shared.model_spec",
    "shared.costmodel",
    "replica.core.sched.sched_types",
    "replica.core.sched.decode_kv",
    "replica.core.sched.admission",
    "replica.core.sched.reorder",
    "replica.core.sched.release",
    "replica.core.sched.decoding",
    "replica.core.sched.scheduler",
    "router.strategies.prefix",
    "loadgen.arrivals",
    "sim.next_uses",
    "sim.pool_index",
    "sim.simulator",
)
ROOT = Path(__file__).resolve().parent.parent  # the directory holding shared/, sim/, replica/
DIGEST_FILE = Path("shared") / "_compiled_digest.json"


def source_path(module: str, root: Path = ROOT) -> Path:
    return root.joinpath(*module.split(".")).with_suffix(".py")


def source_digest(root: Path = ROOT) -> str:
    """SHA-256 over the sources of every module of the set, in order."""
    h = hashlib.sha256()
    for module in MODULES:
        h.update(module.encode() + b"\0" + source_path(module, root).read_bytes() + b"\0")
    return h.hexdigest()


def built_digest(root: Path = ROOT) -> str | None:
    """The digest the installed build records, None where there is no complete build."""
    try:
        return str(json.loads((root / DIGEST_FILE).read_text())["sources_sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def compiled_usable(root: Path = ROOT, environ: dict | None = None) -> tuple[bool, str]:
    """Whether the compiled build runs, and why not: the one decision."""
    env = os.environ if environ is None else environ
    if env.get("KVEMU_INTERPRETED", "") not in ("", "0"):
        return False, "KVEMU_INTERPRETED is set"
    built = built_digest(root)
    if built is None:
        return False, "no compiled build (a C compiler and mypyc at install build one)"
    if built != source_digest(root):
        return False, "the compiled build is older than its sources (pip install -e . rebuilds it)"
    return True, ""


class _SourceFirst(importlib.abc.MetaPathFinder):
    """Loads every module of the set from its source unless the compiled build is usable."""

    def __init__(self) -> None:
        self.use_compiled, self.reason = compiled_usable()

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - the finder protocol's signature
        if self.use_compiled or fullname not in MODULES:
            return None  # the default machinery: the extension module where one is built
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


_FINDER: _SourceFirst | None = None


def install_finder() -> None:
    """Put the finder in place once (before any module of the set is imported)."""
    global _FINDER
    if _FINDER is None:
        _FINDER = _SourceFirst()
        sys.meta_path.insert(0, _FINDER)


def status() -> str:
    """``mypyc`` where every module of the set that is loaded runs compiled, else ``python``."""
    loaded = [sys.modules[m] for m in MODULES if m in sys.modules]
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    if loaded and all(str(getattr(m, "__file__", "")).endswith(suffixes) for m in loaded):
        return "mypyc"
    return "python"


def reason() -> str:
    """Why the set runs from source ("" where it runs compiled)."""
    return _FINDER.reason if _FINDER is not None else compiled_usable()[1]
