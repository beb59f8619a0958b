"""The PNG of ``kvemu sim``: hit ratio and CSR against capacity (matplotlib, imported on demand)."""

from __future__ import annotations

from collections import defaultdict

from shared.plotting import (
    PALETTE,
    capacity_axis,
    ceiling_line,
    hit_mode_entry,
    pyplot,
    thin_overlapping_ticks,
)
from sim.pd_flow import cluster_phrase


def capacity_figure(runs: list[dict], source: str, ceiling: float | None = None):
    """Block hit ratio and CSR against per-replica capacity, one line per policy; the figure."""
    plt = pyplot()
    by_policy: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        by_policy[r["policy"]].append(r)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    caps = sorted({r["capacity_blocks"] for r in runs})
    for i, (policy, rs) in enumerate(by_policy.items()):
        rs.sort(key=lambda r: r["capacity_blocks"])
        xs = [r["capacity_blocks"] for r in rs]
        color = PALETTE[i % len(PALETTE)]
        axes[0].plot(xs, [r["block_hit_ratio"] for r in rs], marker="o", color=color, label=policy)
        axes[1].plot(xs, [r["csr"] for r in rs], marker="o", color=color, label=policy)
    first = runs[0]
    ceiling_line(axes[0], ceiling, [r["block_hit_ratio"] for r in runs])
    axes[1].set_ylim(0, min(max(max(r["csr"] for r in runs) * 1.12, 0.05), 1.05))
    labels = (("block hit ratio (HBM)", "fraction of block accesses found in HBM"),
              ("compute-savings ratio (CSR)", "CSR (prefill compute saved / total)"))
    for ax, (title, ylabel) in zip(axes, labels):
        capacity_axis(ax, caps, first.get("block_size"))
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    hit_mode_entry(axes[0], first["hit_mode"])
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=9, frameon=False)
    policies = ", ".join(by_policy)
    fig.suptitle(f"{source}: {policies} by capacity; {cluster_phrase(first)}; "
                 f"{first['model']} on {first['gpu']}", fontsize=11)
    fig.tight_layout(rect=(0, 0.05 + 0.035 * ((len(labels) - 1) // 4), 1, 1))
    thin_overlapping_ticks(fig)
    return fig


def plot_capacity_curves(runs: list[dict], path: str, source: str = "trace", ceiling: float | None = None) -> None:
    plt = pyplot()
    fig = capacity_figure(runs, source, ceiling)
    fig.savefig(path, dpi=110)
    plt.close(fig)
