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


def save_figure(fig, path: str, dpi: int = 110) -> str:
    """``fig`` written to ``path`` and closed (pyplot keeps every open figure otherwise); the path."""
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


# ---- what every kvemu figure shares -------------------------------------------------------
# Distinct colours for the things compared (policies, reasons); per-replica charts use
# REPLICA_BAR / REPLICA_LINE, which are none of these.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
REPLICA_BAR = "#9aa5b1"
REPLICA_LINE = "#111111"
CEILING = "#7a7a7a"
HIT_MODES = {"holes": "a cached block is a hit wherever it sits in the prompt (holes mode)",
             "prefix": "only the cached prefix of a prompt hits (prefix mode)"}


def short_count(n: float) -> str:
    """2000 -> 2K, 18279 -> 18.3K, 1500000 -> 1.5M."""
    for div, unit in ((1_000_000, "M"), (1_000, "K")):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:g}"


def duration_text(seconds: float) -> str:
    """0.0571 -> '57.1 ms', 1.06 -> '1.06 s', 250 -> '250 s'."""
    return f"{seconds * 1000:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def replicas_phrase(replicas: int, routing: str) -> str:
    """'1 replica' (no routing to speak of) or '4 replicas, cache_aware routing'."""
    return "1 replica" if replicas == 1 else f"{replicas} replicas, {routing} routing"


def capacity_axis(ax, caps: list[int], block_size: int | None = None) -> None:
    """x: capacity per replica, log when it spans 4x or more, ticks at the capacities run."""
    import matplotlib.ticker as mticker

    unit = f"blocks of {block_size} tokens" if block_size else "blocks"
    ax.set_xlabel(f"KV capacity per replica ({unit})")
    if len(caps) > 1 and max(caps) / min(caps) >= 4:
        ax.set_xscale("log")
    ax.xaxis.set_minor_formatter(mticker.NullFormatter())
    if len(caps) <= 10:
        ax.set_xticks(caps, [short_count(c) for c in caps])
        ax.xaxis.set_minor_locator(mticker.NullLocator())
    else:
        ax.xaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: short_count(v)))


def ceiling_line(ax, ceiling: float | None, values, label: str = "infinite cache") -> None:
    """The infinite-cache hit ratio as a labelled line, and a y range that shows it and every value."""
    top = max([v for v in values if v is not None] + [0.0])
    if ceiling is not None:
        ax.axhline(ceiling, color=CEILING, lw=1.2, ls=(0, (6, 3)), label=f"{label}: {ceiling:.3f}")
        top = max(top, ceiling)
    ax.set_ylim(0, min(max(top * 1.12, 0.05), 1.05))


def hit_mode_entry(ax, hit_mode: str) -> None:
    """A legend entry (no line) saying how hits are counted."""
    ax.plot([], [], " ", label="hits: " + HIT_MODES.get(hit_mode, hit_mode))


def thin_overlapping_ticks(fig) -> None:
    """Hide x tick labels that would overlap their left neighbour (kept: the first, then every one
    that clears the last kept)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        kept = None
        for label in sorted((t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()),
                            key=lambda t: t.get_window_extent(renderer).x0):
            box = label.get_window_extent(renderer)
            if kept is not None and box.x0 < kept.x1 + 4:
                label.set_visible(False)
            else:
                kept = box


MISSING = ("--plot needs matplotlib; from a clone: .venv/bin/pip install -e '.[plot]'"
           " (from PyPI: pip install 'kvemu[plot]')")


def require_matplotlib() -> None:
    """Called before a long run that ends in a plot, so a missing extra costs nothing."""
    pyplot()
