"""The figure of agent sessions' task times (matplotlib, imported only when a plot is asked for): per session, its
task time split into its critical path's parts (``loadgen.critical_path``), sessions sorted by task time. The
replay figure draws it as a panel; a study draws it on its own axes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from loadgen.critical_path import PARTS
from shared.plotting import PALETTE

_COLOURS = dict(zip(PARTS, (PALETTE[0], PALETTE[1], PALETTE[2], PALETTE[3], "#bbbbbb")))


def critical_path_panel(ax, paths: Sequence[Mapping[str, float]], title: str = "") -> None:
    """Stacked horizontal bars, one a session (``SessionPath._asdict()`` rows), shortest task at the bottom: queue,
    prefill, decode, tool and other along the critical path, adding up to the task time."""
    rows = sorted(paths, key=lambda p: p["task_s"])
    ys = range(len(rows))
    for part in PARTS:
        values = [p[f"{part}_s"] for p in rows]
        lefts = [sum(max(p[f"{q}_s"], 0.0) for q in PARTS[:PARTS.index(part)]) for p in rows]
        ax.barh(ys, [max(v, 0.0) for v in values], left=lefts, height=0.8, color=_COLOURS[part], label=part)
    ax.set_xlabel("seconds from the session's first arrival to its last finish (task time)")
    ax.set_ylabel(f"agent session ({len(rows)}, sorted by task time)")
    ax.set_yticks([])
    ax.set_title(title or "agent sessions: task time along the critical path", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right", title="critical path", title_fontsize=8)
