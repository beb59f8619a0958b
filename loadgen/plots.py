"""PNG plots (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

from collections import defaultdict

from shared.errors import KvemuError


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - depends on the install
        raise KvemuError("plots need matplotlib: pip install 'kvemu[plot]'") from None
    return plt


def plot_capacity_curves(runs: list[dict], path: str) -> None:
    """Block hit ratio and CSR against per-replica capacity, one line per policy."""
    plt = _pyplot()
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


def plot_replay(summary: dict, records, path: str) -> None:
    """Requests and hit ratio per replica, and the emulated TTFT distribution."""
    plt = _pyplot()
    per = summary["per_replica"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    names = list(per)
    axes[0].bar(names, [per[n]["requests"] for n in names], color="tab:blue", label="requests")
    ax2 = axes[0].twinx()
    ax2.plot(names, [per[n]["token_hit_ratio"] for n in names], "o-", color="tab:orange", label="token hit ratio")
    ax2.set_ylim(0, 1)
    axes[0].set_title("load and hit ratio per replica")
    axes[0].tick_params(axis="x", rotation=30)
    ttfts = sorted(r.ttft_s for r in records if r.status == 200)
    if ttfts:
        axes[1].plot(ttfts, [i / len(ttfts) for i in range(1, len(ttfts) + 1)])
        axes[1].set_xscale("log")
    axes[1].set_title("emulated TTFT (CDF)")
    axes[1].set_xlabel("seconds")
    axes[1].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
