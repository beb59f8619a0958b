"""The PNG of a live replay (matplotlib, imported only when a plot is asked for)."""

from __future__ import annotations

from shared.plotting import pyplot


def plot_replay(summary: dict, records, path: str) -> None:
    """Requests and hit ratio per replica, and the emulated TTFT distribution."""
    plt = pyplot()
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
