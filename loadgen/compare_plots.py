"""The figure of ``kvemu compare`` (matplotlib, imported only when a plot is asked for): the CDFs of TTFT,
TPOT and E2E, measured and predicted overlaid, and each request's predicted E2E against its measured one."""

from __future__ import annotations

import os

import numpy as np

from loadgen.compare import FORMATS, Comparison, Run
from shared.plotting import CEILING, PALETTE, pyplot

MEASURED, PREDICTED = PALETTE[0], PALETTE[1]
WIDE = 30.0  # a log axis once the largest value is this many times the smallest


def _values(run: Run, metric: str) -> np.ndarray:
    return np.array([v for r in run.records if (v := getattr(r, f"{metric}_s")) is not None], dtype=np.float64)


def _unit(values: np.ndarray) -> tuple[float, str]:
    """ms below a second's median, else s."""
    return (1000.0, "ms") if values.size and float(np.median(values)) < 1.0 else (1.0, "s")


def _log_if_wide(values: np.ndarray) -> bool:
    pos = values[values > 0]
    return bool(pos.size) and float(pos.max()) / float(pos.min()) >= WIDE


def _log_axis(axis) -> None:
    """A log axis labelled 0.1, 1, 10 rather than powers of ten: a reader reads milliseconds and seconds."""
    import matplotlib.ticker as mticker

    axis.set_major_locator(mticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(mticker.NullFormatter())


def _percent(x: float | None) -> str:
    return "n/a" if x is None else f"{x * 100:+.1f}%"


def _label(run: Run, role: str) -> str:
    where = os.path.join(os.path.basename(os.path.dirname(os.path.abspath(run.path))), os.path.basename(run.path))
    return f"{role}: {where} ({FORMATS[run.format]}, {len(run.records):,} requests)"


def _cdf(ax, cmp: Comparison, metric: str, title: str) -> None:
    m, p = _values(cmp.measured, metric), _values(cmp.predicted, metric)
    scale, unit = _unit(np.concatenate([m, p]))
    for values, colour, ls, role in ((m, MEASURED, "-", "measured"), (p, PREDICTED, "--", "predicted")):
        xs = np.sort(values) * scale
        ax.step(xs, np.arange(1, xs.size + 1) / max(xs.size, 1), where="post", color=colour, ls=ls, lw=1.8,
                label=f"{role} ({xs.size:,} requests)")
    if _log_if_wide(np.concatenate([m, p])):
        ax.set_xscale("log")
        _log_axis(ax.xaxis)
    err = cmp.figures[f"{metric}_mean_s"].rel_error
    med = cmp.per_request[metric].median
    ax.set_title(f"{title}: mean {_percent(err)}, per-request median |error| "
                 f"{'n/a' if med is None else f'{med * 100:.1f}%'}", fontsize=10)
    ax.set_xlabel(f"{title} ({unit})")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")


def _scatter(ax, cmp: Comparison) -> None:
    pairs = [(a.e2e_s, b.e2e_s) for a, b in zip(cmp.measured.records, cmp.predicted.records)
             if a.e2e_s is not None and b.e2e_s is not None]
    xy = np.array(pairs, dtype=np.float64).reshape(-1, 2)
    scale, unit = _unit(xy[:, 0])
    xy = xy * scale
    ax.scatter(xy[:, 0], xy[:, 1], s=12, alpha=0.6, color=PREDICTED, edgecolors="none",
               label=f"one request ({len(xy):,})")
    lo = float(xy.min()) if xy.size else 0.0
    hi = float(xy.max()) if xy.size else 1.0
    wide = _log_if_wide(xy.ravel())
    lo = lo / 1.3 if wide else max(lo - 0.05 * (hi - lo), 0.0)
    hi = hi * 1.3 if wide else hi + 0.05 * (hi - lo)
    line = np.geomspace(max(lo, 1e-9), hi, 50) if wide else np.linspace(lo, hi, 50)
    ax.plot(line, line, color=CEILING, ls="--", lw=1.2, label="y = x (exact prediction)")
    ax.fill_between(line, line * 0.9, line * 1.1, color=CEILING, alpha=0.25, lw=0, label="within 10%")
    if wide:
        ax.set_xscale("log")
        ax.set_yscale("log")
        _log_axis(ax.xaxis)
        _log_axis(ax.yaxis)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal", adjustable="box")
    e = cmp.per_request["e2e"]
    tail = "" if e.median is None or e.p90 is None else \
        f": |error| median {e.median * 100:.1f}%, p90 {e.p90 * 100:.1f}%"
    ax.set_title(f"E2E per request, predicted vs measured{tail}", fontsize=10)
    ax.set_xlabel(f"measured E2E ({unit})")
    ax.set_ylabel(f"predicted E2E ({unit})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")


def plot_comparison(cmp: Comparison, path: str) -> None:
    """One PNG at ``path``: three CDFs (TTFT, TPOT, E2E) and the per-request E2E scatter."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(13, 10.5))
    _cdf(axes[0][0], cmp, "ttft", "TTFT")
    _cdf(axes[0][1], cmp, "tpot", "TPOT")
    _cdf(axes[1][0], cmp, "e2e", "E2E")
    _scatter(axes[1][1], cmp)
    fig.suptitle(f"{_label(cmp.measured, 'measured')}\n{_label(cmp.predicted, 'predicted')}\n"
                 "relative error = (predicted - measured) / measured", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
