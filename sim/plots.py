"""The PNG of ``kvemu sim``: hit ratio and CSR against capacity (matplotlib, imported on demand)."""

from __future__ import annotations

from collections import defaultdict

from shared.plotting import pyplot


def plot_capacity_curves(runs: list[dict], path: str) -> None:
    """Block hit ratio and CSR against per-replica capacity, one line per policy."""
    plt = pyplot()
    by_policy: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        by_policy[r["policy"]].append(r)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for policy, rs in sorted(by_policy.items()):
        rs.sort(key=lambda r: r["capacity_blocks"])
        xs = [r["capacity_blocks"] for r in rs]
        axes[0].plot(xs, [r["block_hit_ratio"] for r in rs], marker="o", label=policy)
        axes[1].plot(xs, [r["csr"] for r in rs], marker="o", label=policy)
    for ax, title in zip(axes, ("block hit ratio", "compute-savings ratio (CSR)")):
        ax.set_xlabel("capacity per replica (blocks)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if len({r["capacity_blocks"] for r in runs}) > 2:
            ax.set_xscale("log")
    axes[0].legend()
    first = runs[0]
    fig.suptitle(f"{first['replicas']} replica(s), {first['routing']} routing, {first['hit_mode']} hits")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
