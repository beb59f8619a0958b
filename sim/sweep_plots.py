"""The figure of a ``kvemu sweep`` (matplotlib, Agg, imported only when a plot is asked for).

Panels: (a) block hit ratio against per-replica capacity, one line per policy, one panel per
(routing, replicas) combination (only the first one when there are more than ``MAX_PANELS``),
with the LRU miss-ratio curve, the mean-field estimate (one replica, or a routing that keeps
conversations on one replica) and the infinite-cache bound overlaid;
(b) CSR against capacity, same panels; (c) TTFT p50 and p99 against capacity, same panels;
(d) requests and block hit ratio per replica for one point (the largest-capacity LRU run with
the most replicas).

The miss-ratio curve of a multi-replica run is the access-weighted mean of the replicas' own
curves, ``H(c) = Σ a_i·h_i(c) / Σ a_i`` (``a_i`` the accesses replica i tracked): each replica
is an LRU of ``c`` blocks over the requests routed to it. It is exact for one replica serving
one request at a time in ``holes`` mode; otherwise it assumes the routing and the batching of
the run it comes from (the largest capacity) would stay the same at every capacity.
"""

from __future__ import annotations

import numpy as np

from loadgen.source import trace_name
from loadgen.trace import infinite_cache_hit_ratio, response_hashes
from router.strategies import SPECS
from shared.plotting import (
    PALETTE,
    REPLICA_BAR,
    REPLICA_LINE,
    capacity_axis,
    ceiling_line,
    hit_mode_entry,
    pyplot,
    thin_overlapping_ticks,
)
from sim.pd_flow import cluster_phrase

MAX_PANELS = 4
# routings that keep a conversation on one replica, so R replicas of N blocks act like one
# cache of R·N for the mean-field estimate; with the others a next turn lands anywhere
AFFINE = tuple(name for name, spec in SPECS.items() if spec.keeps_sessions)


def require_matplotlib() -> None:
    pyplot()


def combined_mrc(rec: dict) -> tuple[np.ndarray, np.ndarray] | None:
    """(capacities, hit ratios) of the access-weighted mean of the replicas' MRCs, or None."""
    curves = [(p["reuse"]["accesses"], p["reuse"]["mrc"]) for p in rec.get("per_replica", ())
              if p.get("reuse") and p["reuse"].get("mrc")]
    total = sum(a for a, _ in curves)
    if not total:
        return None
    xs = np.array(sorted({c for _, m in curves for c, _ in m if c >= 1}), dtype=np.float64)
    ys = np.zeros_like(xs)
    for accesses, mrc in curves:
        cs = np.array([c for c, _ in mrc], dtype=np.float64)
        hs = np.array([h for _, h in mrc], dtype=np.float64)
        keep = cs >= 1
        ys += accesses / total * np.interp(np.log(xs), np.log(cs[keep]), hs[keep])
    return xs, ys


def _by_combo(records: list[dict]) -> dict[tuple[str, int], list[dict]]:
    out: dict[tuple[str, int], list[dict]] = {}
    for r in records:
        out.setdefault((r["routing"], r["replicas"]), []).append(r)
    return out


def _policy_lines(ax, recs: list[dict], key: str, colors: dict, **style) -> None:
    by_policy: dict[str, list[dict]] = {}
    for r in recs:
        by_policy.setdefault(r["policy"], []).append(r)
    label = style.pop("label", None)  # "_..." keeps the lines out of the legend
    for policy in sorted(by_policy, key=list(colors).index):
        rs = sorted(by_policy[policy], key=lambda r: r["capacity_blocks"])
        ax.plot([r["capacity_blocks"] for r in rs], [r[key] for r in rs], marker="o", ms=4, color=colors[policy],
                label=label or policy, **style)


def _overlays(ax, combo, caps, mrc_rec, mean_field) -> None:
    lo, hi = min(caps), max(caps)
    if mrc_rec is not None and (curve := combined_mrc(mrc_rec)) is not None:
        xs, ys = curve
        inside = (xs > lo) & (xs < hi)
        grid = np.concatenate(([lo], xs[inside], [hi]))
        ax.plot(grid, np.interp(np.log(grid), np.log(xs), ys), "k--", lw=1.2, label="LRU, from reuse distances (miss-ratio curve)")
    if mean_field is not None and (combo[1] == 1 or combo[0] in AFFINE):
        fn, label = mean_field
        grid = np.geomspace(lo, hi, 48) if hi > lo else np.array([lo])
        ax.plot(grid, [fn(float(c), combo[1]) for c in grid], ":", color="0.35", lw=1.8, label=label)


def _style(ax, caps, ylabel: str, title: str, block_size: int | None) -> None:
    capacity_axis(ax, caps, block_size)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)


def load_point(records: list[dict]) -> dict:
    """The largest-capacity LRU run (any policy if none is LRU) with the most replicas."""
    pool = [r for r in records if r["policy"] == "lru"] or records
    return max(pool, key=lambda r: (r["replicas"], r["capacity_blocks"], r["routing"] == "cache_aware"))


def _load_chart(ax, rec: dict) -> None:
    per = rec["per_replica"]
    names = [p.get("replica", str(i)).replace("replica-", "r") for i, p in enumerate(per)]
    ax.bar(names, [p["requests"] for p in per], color=REPLICA_BAR, label="requests routed (bars, left axis)")
    ax.set_ylabel("requests routed")
    ax.set_xlabel("replica")
    ax2 = ax.twinx()
    ax2.plot(names, [p["block_hit_ratio"] for p in per], "o-", color=REPLICA_LINE,
             label="block hit ratio, HBM (line, right axis)")
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("block hit ratio (HBM)")
    # two lines: one would be wider than its panel and be cut at the figure's left edge
    ax.set_title(f"per replica: {rec['policy']} at {rec['capacity_blocks']:,} blocks\n"
                 f"{cluster_phrase(rec)} (imbalance {rec['load_imbalance']:.2f})",
                 fontsize=10)
    lines = ax.get_legend_handles_labels()
    more = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="lower right")


def _axes(plt, ncombos: int):
    """(figure, hit-ratio axes, CSR axes, TTFT axes, load axis, legend axis or None)."""
    if ncombos == 1:
        fig, axes = plt.subplots(2, 2, figsize=(13, 9))
        return fig, [axes[0, 0]], [axes[0, 1]], [axes[1, 0]], axes[1, 1], None
    fig = plt.figure(figsize=(max(4.6 * ncombos, 11), 14))
    gs = fig.add_gridspec(4, ncombos)
    rows = [[fig.add_subplot(gs[r, i]) for i in range(ncombos)] for r in range(3)]
    legend = fig.add_subplot(gs[3, -1])
    legend.axis("off")
    return fig, rows[0], rows[1], rows[2], fig.add_subplot(gs[3, :-1]), legend


def _ttft_lines(ax, recs: list[dict], colors: dict) -> None:
    import matplotlib.ticker as mticker

    if any(r["ttft_p50_s"] is None for r in recs):  # cache-only replay: no clock, so no latency
        ax.text(0.5, 0.5, "cache-only replay:\nno clock, no TTFT", ha="center", va="center",
                transform=ax.transAxes, fontsize=10, color="0.4")
        caps = sorted({r["capacity_blocks"] for r in recs})  # the other panels' span: their ticks fit here too
        if len(caps) > 1:
            ax.set_xlim(caps[0] / 1.15, caps[-1] * 1.15)
        ax.set_yticks([])  # no latency axis without latencies
        return
    _policy_lines(ax, recs, "ttft_p50_s", colors, label="_p50")
    _policy_lines(ax, recs, "ttft_p99_s", colors, ls="--", label="_p99")
    if all(r["ttft_p50_s"] > 0 for r in recs):
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(mticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(mticker.NullFormatter())


def plot_sweep(records: list[dict], mrc_records: list[dict], path: str, mean_field=None,
               ceiling: float | None = None) -> None:
    """Write the sweep figure of grid ``records`` to ``path`` (see the module docstring)."""
    plt = pyplot()
    fig = sweep_figure(records, mrc_records, mean_field, ceiling)
    fig.savefig(path, dpi=90, pil_kwargs={"optimize": True})
    plt.close(fig)


def sweep_figure(records: list[dict], mrc_records: list[dict], mean_field=None, ceiling: float | None = None):
    plt = pyplot()
    groups = _by_combo(records)
    combos = list(groups)
    # one replica is the same under every routing: one panel for it
    distinct = [c for i, c in enumerate(combos) if c[1] > 1 or not any(o[1] == 1 for o in combos[:i])]
    shown = distinct if len(distinct) <= MAX_PANELS else distinct[:1]
    mrc_by = {(r["routing"], r["replicas"]): r for r in mrc_records}
    policies = list(dict.fromkeys(r["policy"] for r in records))
    colors = {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(policies)}
    fig, hit_axes, csr_axes, ttft_axes, load_ax, legend_ax = _axes(plt, len(shown))
    first = records[0]
    bs = first.get("block_size")
    for combo, ax_h, ax_c, ax_t in zip(shown, hit_axes, csr_axes, ttft_axes):
        recs = groups[combo]
        caps = sorted({r["capacity_blocks"] for r in recs})
        where = cluster_phrase(recs[0])
        _policy_lines(ax_h, recs, "block_hit_ratio", colors)
        _overlays(ax_h, combo, caps, mrc_by.get(combo), mean_field)
        ceiling_line(ax_h, ceiling, [y for line in ax_h.get_lines() for y in line.get_ydata()])
        _style(ax_h, caps, "fraction of block accesses found in HBM", f"block hit ratio, {where}", bs)
        _policy_lines(ax_c, recs, "csr", colors)
        ax_c.set_ylim(0, min(max(max(r["csr"] for r in recs) * 1.12, 0.05), 1.05))
        _style(ax_c, caps, "CSR (prefill compute saved / total)", f"compute-savings ratio, {where}", bs)
        _ttft_lines(ax_t, recs, colors)
        _style(ax_t, caps, "TTFT (s, emulated)", f"time to first token, {where}\np50 solid, p99 dashed", bs)
    hit_mode_entry(hit_axes[0], first["hit_mode"])
    handles, labels = hit_axes[0].get_legend_handles_labels()
    if legend_ax is None:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3), fontsize=9, frameon=False)
    else:
        legend_ax.legend(handles, labels, loc="center", fontsize=9)
    _load_chart(load_ax, load_point(records))
    more = ""
    if len(shown) < len(distinct):
        more = f"; {len(distinct) - 1} more routing x replicas combination(s) in the results only"
    source = trace_name(first.get("trace", {}).get("source", ""))
    mode = "cache-only" if first.get("mode") == "cache_only" else f"max_running {first['settings']['max_running']}"
    fig.suptitle(f"{source}: {', '.join(policies)} by capacity; {first['model']} on {first['gpu']}, "
                 f"{mode}{more}", fontsize=11)
    bottom = 0.03 + 0.022 * ((len(labels) + 2) // 3) if legend_ax is None else 0
    fig.tight_layout(rect=(0, bottom, 1, 0.97))
    thin_overlapping_ticks(fig)
    return fig


def ceiling(trace, response_kv: str) -> float | None:
    """The infinite-cache hit ratio a figure draws: with response KV kept, a later prompt can hit
    the blocks of the responses before it too."""
    return infinite_cache_hit_ratio(trace.requests, response_hashes(trace) if response_kv == "keep" else None)
