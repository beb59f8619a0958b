"""matplotlib, imported only when a plot is asked for (the Agg backend: no display needed)."""

from __future__ import annotations

from typing import Any

from shared.errors import KvemuError


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or a one-line error naming the extra to install."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - depends on the install
        raise KvemuError(MISSING) from None
    return plt


MISSING = ("--plot needs matplotlib; from a clone: .venv/bin/pip install -e '.[plot]'"
           " (from PyPI: pip install 'kvemu[plot]')")


def require_matplotlib() -> None:
    """Called before a long run that ends in a plot, so a missing extra costs nothing."""
    pyplot()
