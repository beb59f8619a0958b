"""Checks every kvemu figure must pass, read from matplotlib's objects after drawing."""

from __future__ import annotations

from matplotlib.colors import to_hex


def _boxes_overlap(a, b, pad: float = 1.0) -> bool:
    return a.x0 < b.x1 - pad and b.x0 < a.x1 - pad and a.y0 < b.y1 - pad and b.y0 < a.y1 - pad


def check_readable(fig) -> None:
    """Every panel titled and labelled on both axes; no two visible x tick labels of an axes
    overlap; no two panel titles overlap each other, the figure title or a y label."""
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    titles = [fig._suptitle.get_window_extent(r)] if fig._suptitle is not None else []
    ylabels = []
    for ax in fig.axes:
        if not ax.axison:  # a legend-only cell
            continue
        twin = ax.get_title() == "" and any(o is not ax and o.bbox.bounds == ax.bbox.bounds for o in fig.axes)
        if not twin:
            assert ax.get_title(), f"an untitled panel: {ax}"
            assert ax.get_xlabel(), f"{ax.get_title()!r}: no x label"
            titles.append(ax.title.get_window_extent(r))
        assert ax.get_ylabel(), f"{ax.get_title()!r}: no y label"
        ylabels.append((ax.get_ylabel(), ax.yaxis.label.get_window_extent(r)))
        labels = [t for t in ax.get_xticklabels() if t.get_visible() and t.get_text()]
        boxes = sorted((t.get_window_extent(r) for t in labels), key=lambda b: b.x0)
        for a, b in zip(boxes, boxes[1:]):
            assert not _boxes_overlap(a, b), f"{ax.get_title()!r}: x tick labels overlap"
    for i, a in enumerate(titles):
        for b in titles[i + 1:]:
            assert not _boxes_overlap(a, b), "two titles overlap"
        for text, b in ylabels:
            assert not _boxes_overlap(a, b), f"the y label {text!r} runs into a title"


def legend_labels(ax) -> list[str]:
    leg = ax.get_legend()
    return [t.get_text() for t in leg.get_texts()] if leg is not None else []


def ceiling_of(ax) -> float:
    """The infinite-cache line's height; it must lie inside the axes' y range."""
    lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("infinite cache")]
    assert len(lines) == 1, [ln.get_label() for ln in ax.get_lines()]
    y = lines[0].get_ydata()[0]
    lo, hi = ax.get_ylim()
    assert lo <= y < hi, f"the infinite-cache line at {y} is clipped by {lo}..{hi}"
    return y


def line_colors(ax, skip_prefix: tuple[str, ...] = ("_",)) -> dict[str, str]:
    return {ln.get_label(): to_hex(ln.get_color()) for ln in ax.get_lines()
            if not ln.get_label().startswith(skip_prefix)}
