"""The figures of the shared KV store study (bench/bench_shared_store.py, docs/shared-store.md; matplotlib,
imported on demand): hit ratio and TTFT against the store's size per routing, the gap between routings
(the study's headline), the store's link at 100 and 400 Gb/s, and write-through against writes of
evictions."""

from __future__ import annotations

import math
import os

from shared.plotting import PALETTE, pyplot, save_figure

ROUTING_COLORS = {"cache_aware": PALETTE[0], "session": PALETTE[2], "round_robin": PALETTE[3]}
TITLES = {"mooncake": "Mooncake conversation trace", "mooncake-x20": "Mooncake conversation trace x20",
          "agent": "agent preset"}
GIB = 1 << 30


def _title(doc: dict, w: str) -> str:
    s = doc["working_sets"][w]
    return (f"{TITLES.get(w, w)}\nW = {s['working_set_blocks']:,} blocks of {s['block_size']} tokens"
            f" ({s['working_set_gib']:,.0f} GiB)")


class _Axis:
    """Store sizes on a log axis in fractions of the working set W, store 0 drawn one step left of the
    smallest size (a log axis has no 0)."""

    def __init__(self, doc: dict, w: str) -> None:
        self.w_blocks = doc["working_sets"][w]["working_set_blocks"]
        grid = doc["grid"][w]
        sizes = sorted({p["store_blocks"] for p in grid if p["store_blocks"]})
        self.zero = (sizes[0] / self.w_blocks) / 4 if sizes else 1 / 64
        self.ticks = {p["store_blocks"]: p["fraction"] for p in grid}

    def x(self, blocks: int) -> float:
        return blocks / self.w_blocks if blocks else self.zero

    def apply(self, ax, gib_of=None) -> None:
        import matplotlib.ticker as mticker

        ax.set_xscale("log", base=2)
        blocks = sorted(self.ticks)
        # W and W/0.9 sit close on a log axis: the latter's label on a second line
        ax.set_xticks([self.x(b) for b in blocks], [("\n" if self.ticks[b] == "W/0.9" else "") + self.ticks[b]
                                                     for b in blocks], fontsize=8)
        ax.xaxis.set_minor_locator(mticker.NullLocator())
        ax.set_xlim(self.zero / 1.4, max(self.x(b) for b in blocks) * 1.4)
        ax.set_xlabel("store size (W: the trace's working set; W/0.9: no watermark eviction)", fontsize=8)


def _plain(minor: bool = False):
    """Tick labels as plain numbers (1,000, not 10^3); minor ticks labelled only at 2 and 5 x a power of 10."""
    import matplotlib.ticker as mticker

    def fmt(v: float, _pos) -> str:
        if minor and round(v / 10 ** math.floor(math.log10(v))) not in (2, 5):
            return ""
        return f"{v:,.0f}" if v >= 1 else f"{v:g}"

    return mticker.FuncFormatter(fmt)


def _by_routing(points: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for p in sorted(points, key=lambda p: p["store_blocks"]):
        out.setdefault(p["routing"], []).append(p)
    return out


def hit_figure(doc: dict):
    """Per workload: the hit ratio across all levels (and HBM's) against the store's size, then TTFT p50 and p99."""
    plt = pyplot()
    grid = doc["grid"]
    fig, axes = plt.subplots(2, len(grid), figsize=(5.6 * len(grid), 8.4), squeeze=False)
    for col, (w, pts) in enumerate(grid.items()):
        axis = _Axis(doc, w)
        ax, bx = axes[0][col], axes[1][col]
        for r, mine in _by_routing(pts).items():
            xs = [axis.x(p["store_blocks"]) for p in mine]
            c = ROUTING_COLORS.get(r, "k")
            ax.plot(xs, [p["all_levels_block_hit_ratio"] for p in mine], marker="o", color=c, label=f"{r}: all levels")
            ax.plot(xs, [p["hbm_block_hit_ratio"] for p in mine], ls=":", marker=".", color=c, lw=1,
                    label=f"{r}: HBM only")
            bx.plot(xs, [p["ttft_p50_s"] * 1000 for p in mine], marker="o", color=c, label=f"{r} p50")
            bx.plot(xs, [p["ttft_p99_s"] * 1000 for p in mine], marker="s", ls="--", color=c, label=f"{r} p99")
        ceiling = doc["working_sets"][w]["infinite_cache_block_hit_ratio"]
        ax.axhline(ceiling, color="0.5", ls="--", lw=1, label="infinite cache (the trace's ceiling)")
        cross = doc.get("crossover", {}).get(w, {}).get("within_from_blocks")
        for a in (ax, bx):
            if cross is not None:
                a.axvline(axis.x(cross), color="0.3", lw=6, alpha=0.12)
            axis.apply(a)
            a.grid(alpha=0.3)
        top = max([ceiling] + [p["all_levels_block_hit_ratio"] for p in pts])
        ax.set_ylim(0, min(1.02, top * 1.15))
        ax.set_ylabel("block hit ratio")
        ax.set_title(_title(doc, w), fontsize=9)
        bx.set_yscale("log")
        bx.yaxis.set_major_formatter(_plain())
        bx.yaxis.set_minor_formatter(_plain(minor=True))
        bx.set_ylabel("TTFT (ms, emulated; log scale)")
        bx.set_title("TTFT p50 (solid) and p99 (dashed)", fontsize=9)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False, bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(f"A KV store shared by {doc['replicas']} replicas: hit ratio and TTFT by store size and routing\n"
                 "(grey band: the store size from which round_robin stays within 2 points of cache_aware)", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


def gap_figure(doc: dict):
    """The headline: cache_aware's hit ratio across all levels minus round_robin's (and session's), in points,
    against the store's size, each workload's crossover marked."""
    plt = pyplot()
    cross = doc["crossover"]
    fig, axes = plt.subplots(1, len(cross), figsize=(5.2 * len(cross), 4.4), squeeze=False)
    within = doc.get("within", 0.02) * 100
    for ax, (w, c) in zip(axes[0], cross.items()):
        axis = _Axis(doc, w)
        grid_sizes = {p["store_blocks"] for p in doc["grid"][w]}
        rr = [(b, g) for b, g in c["gaps"]]
        ax.axhspan(-within, within, color="0.85", label=f"within {within:g} points")
        ax.plot([axis.x(b) for b, _ in rr], [g * 100 for _, g in rr], marker="o", color=ROUTING_COLORS["round_robin"],
                label="cache_aware - round_robin")
        extra = [(b, g) for b, g in rr if b not in grid_sizes]
        if extra:
            ax.plot([axis.x(b) for b, _ in extra], [g * 100 for _, g in extra], ls="none", marker="D", mfc="white",
                    color=ROUTING_COLORS["round_robin"], label="bisection points")
        if c.get("session_gaps"):
            ax.plot([axis.x(b) for b, _ in c["session_gaps"]], [g * 100 for _, g in c["session_gaps"]], marker="s",
                    ls="--", color=ROUTING_COLORS["session"], label="cache_aware - session")
        at = c["within_from_blocks"]
        if at is not None:
            gib = at * doc["working_sets"][w]["block_bytes"] / GIB
            ax.axvline(axis.x(at), color="k", lw=1)
            ax.annotate(f"within from\n{at:,} blocks\n{gib:,.0f} GiB = {at / axis.w_blocks:.3g} W", (axis.x(at), 0),
                        xytext=(6, 40), textcoords="offset points", fontsize=8,
                        arrowprops={"arrowstyle": "->", "lw": 0.8})
        axis.apply(ax)
        top = max([abs(g) * 100 for _, g in rr + [tuple(x) for x in c.get("session_gaps", [])]] + [within]) * 1.2
        ax.set_ylim(-max(top * 0.25, within * 1.5), top)
        ax.set_ylabel("hit ratio across all levels, difference (points)")
        ax.set_title(_title(doc, w), fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle("Does routing still matter? cache_aware's hit ratio minus the others', by store size", fontsize=11)
    fig.tight_layout()
    return fig


def link_figure(doc: dict):
    """Each replica's link to the store at 100 and 400 Gb/s: TTFT p50 and p99 per size and routing."""
    plt = pyplot()
    link = {w: pts for w, pts in doc["link"].items() if pts}
    fig, axes = plt.subplots(1, len(link), figsize=(5.6 * len(link), 5.0), squeeze=False)
    for ax, (w, pts) in zip(axes[0], link.items()):
        keys = sorted({(p["store_blocks"], p["routing"]) for p in pts},
                      key=lambda k: (k[0], list(ROUTING_COLORS).index(k[1])))
        by = {(p["store_blocks"], p["routing"], p["nic_gbps"]): p for p in pts}
        labels = []
        for y, (b, r) in enumerate(keys):
            frac = next(p["fraction"] for p in pts if p["store_blocks"] == b)
            labels.append(f"{frac}, {r}")
            c = ROUTING_COLORS.get(r, "k")
            for g, mfc, dy in ((400.0, c, -0.15), (100.0, "white", 0.15)):
                p = by.get((b, r, g))
                if p is None:
                    continue
                ax.plot([p["ttft_p50_s"] * 1000, p["ttft_p99_s"] * 1000], [y + dy] * 2, color=c, lw=1, alpha=0.6)
                ax.plot([p["ttft_p50_s"] * 1000], [y + dy], "o", color=c, mfc=mfc, ms=7)
                ax.plot([p["ttft_p99_s"] * 1000], [y + dy], "s", color=c, mfc=mfc, ms=7)
        ax.set_yticks(range(len(keys)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(_plain())
        ax.xaxis.set_minor_formatter(_plain(minor=True))
        ax.set_xlabel("TTFT (ms, emulated; log scale): circle p50, square p99")
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(_title(doc, w), fontsize=9)
    handles = [plt.Line2D([], [], ls="none", marker="o", color="0.3", ms=7),
               plt.Line2D([], [], ls="none", marker="o", color="0.3", mfc="white", ms=7)]
    fig.legend(handles, ["400 Gb/s per replica (filled; the upper of each pair)",
                         "100 Gb/s per replica (hollow; the lower)"], loc="lower center", ncol=2, fontsize=8,
               frameon=False)
    fig.suptitle("Each replica's link to the store (--shared-nic-gbps), the store's aggregate at 640 Gb/s", fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return fig


def write_figure(doc: dict):
    """Write-through against writes of HBM's evictions: the hit ratio across all levels and from the store."""
    plt = pyplot()
    write = {w: pts for w, pts in doc["write"].items() if pts}
    fig, axes = plt.subplots(1, len(write), figsize=(6.0 * len(write), 4.6), squeeze=False)
    for ax, (w, pts) in zip(axes[0], write.items()):
        keys = sorted({(p["store_blocks"], p["routing"]) for p in pts},
                      key=lambda k: (k[0], list(ROUTING_COLORS).index(k[1])))
        by = {(p["store_blocks"], p["routing"], p["write"]): p for p in pts}
        h = 0.38
        for i, (mode, hatch) in enumerate((("through", None), ("evict", "//"))):
            ys = [y + (i - 0.5) * h for y in range(len(keys))]
            hbm = [by[(b, r, mode)]["hbm_block_hit_ratio"] if (b, r, mode) in by else 0 for b, r in keys]
            store = [by[(b, r, mode)]["shared_block_hit_ratio"] if (b, r, mode) in by else 0 for b, r in keys]
            colors = [ROUTING_COLORS.get(r, "k") for _, r in keys]
            ax.barh(ys, hbm, height=h, color="0.75", hatch=hatch, edgecolor="0.4", lw=0.5)
            ax.barh(ys, store, left=hbm, height=h, color=colors, hatch=hatch, edgecolor="0.4", lw=0.5, alpha=0.8)
        ax.set_yticks(range(len(keys)),
                      [f"{next(p['fraction'] for p in pts if p['store_blocks'] == b)}, {r}" for b, r in keys], fontsize=8)
        ax.invert_yaxis()
        ceiling = doc["working_sets"][w]["infinite_cache_block_hit_ratio"]
        ax.set_xlim(0, min(1.0, max([ceiling] + [p["all_levels_block_hit_ratio"] for p in pts]) * 1.12))
        ax.set_xlabel("block hit ratio")
        ax.axvline(ceiling, color="0.4", ls="--", lw=1)
        ax.grid(axis="x", alpha=0.3)
        ax.set_title(_title(doc, w), fontsize=9)
    handles = [plt.Rectangle((0, 0), 1, 1, color="0.75", ec="0.4"),
               plt.Rectangle((0, 0), 1, 1, color=PALETTE[0], alpha=0.8, ec="0.4"),
               plt.Rectangle((0, 0), 1, 1, fc="white", hatch="//", ec="0.4"),
               plt.Line2D([], [], color="0.4", ls="--")]
    fig.legend(handles, ["hits in HBM", "hits in the store (routing's colour)", "hatched, lower bar: --shared-write evict"
                         " (upper: through)", "infinite cache"], loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle("What a replica writes to the store: every block it computes (--shared-write through) or what its"
                 " HBM evicts (evict)", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def plot_study(doc: dict, folder: str) -> list[str]:
    """Every figure the study's document has parts for, as ``folder/shared-store-*.png``; the paths written."""
    out = []
    for key, name, make in (("grid", "shared-store-hit.png", hit_figure), ("crossover", "shared-store-gap.png", gap_figure),
                            ("link", "shared-store-link.png", link_figure),
                            ("write", "shared-store-write.png", write_figure)):
        if doc.get(key) and any(doc[key].values()):
            out.append(save_figure(make(doc), os.path.join(folder, name)))
    return out

