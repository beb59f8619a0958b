"""The PNG of a live replay, and of ``kvemu demo`` (matplotlib, imported only when a plot is asked for).

Panels: requests routed and block hit ratio per replica; the cluster's block hit ratio over
the replay; the emulated TTFT distribution; for an agent trace, each session's task time along its
critical path (``loadgen.critical_path_plots``). Hit-ratio panels carry the infinite-cache ceiling
of the requests replayed.
"""

from __future__ import annotations

from shared.plotting import (
    CEILING,
    PALETTE,
    REPLICA_BAR,
    REPLICA_LINE,
    ceiling_line,
    duration_text,
    pyplot,
    thin_overlapping_ticks,
)


def context_line(ctx: dict) -> str:
    """'mix preset, 300 s of trace 20x faster: 4 replicas x 8,192 blocks, lru, cache_aware routing, M on G'."""
    parts = [str(ctx.get("source", "replay"))]
    if ctx.get("duration_s"):
        parts[0] += f", {ctx['duration_s']:.0f} s of trace"
    if ctx.get("speedup"):
        parts[0] += f" replayed {ctx['speedup']:g}x faster"
    n = ctx.get("replicas")
    cap = f" x {ctx['capacity_blocks']:,} blocks" if ctx.get("capacity_blocks") else ""
    where = [f"{n} replica{'s' if n != 1 else ''}{cap}" if n else None, ctx.get("policy"),
             f"{ctx['routing']} routing" if ctx.get("routing") and n != 1 else None,
             f"{ctx['model']} on {ctx['gpu']}" if ctx.get("model") else None]
    return parts[0] + ": " + ", ".join(w for w in where if w)


def _per_replica(ax, summary: dict, ceiling: float | None) -> None:
    per = summary["per_replica"]
    names = list(per)
    short = [n.replace("replica-", "r") for n in names]
    ax.bar(short, [per[n]["requests"] for n in names], color=REPLICA_BAR, label="requests routed (bars, left axis)")
    ax.set_ylabel("requests routed")
    ax.set_xlabel("replica")
    ax2 = ax.twinx()
    ax2.plot(short, [per[n]["block_hit_ratio"] for n in names], "o-", color=REPLICA_LINE,
             label="block hit ratio (line, right axis)")
    ceiling_line(ax2, ceiling, [per[n]["block_hit_ratio"] for n in names], "infinite cache, whole replay")
    ax2.set_ylabel("block hit ratio")
    ax.set_title("per replica: requests routed and block hit ratio", fontsize=10)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    # room above the ratios and bars for the legend (ticks only where ratios can be)
    top = ax2.get_ylim()[1]
    ax2.set_yticks([t for t in ax2.get_yticks() if 0 <= t <= top + 1e-9])
    ax2.set_ylim(0, top * 1.35)
    ax.set_ylim(0, max(per[n]["requests"] for n in names) * 1.35 if names else 1)
    ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="upper center", ncol=2)


def _over_time(ax, records, ceiling: float | None) -> None:
    ok = sorted((r for r in records if r.status == 200), key=lambda r: r.sent_at_s)
    if ok:
        span = max(ok[-1].sent_at_s, 1e-9)
        bins = max(min(len(ok) // 20, 30), 1)
        width = span / bins
        xs, window, running = [], [], []
        hit = blocks = 0
        for b in range(bins):
            part = [r for r in ok if b * width <= r.sent_at_s < (b + 1) * width or (b == bins - 1 and r.sent_at_s >= span)]
            h, n = sum(r.cached_blocks for r in part), sum(r.prompt_blocks for r in part)
            hit, blocks = hit + h, blocks + n
            xs.append((b + 1) * width)
            window.append(h / n if n else None)
            running.append(hit / blocks if blocks else None)
        ax.plot(xs, window, "o-", ms=3, color=PALETTE[0], label=f"per {width:.3g} s window")
        ax.plot(xs, running, "-", lw=2, color=PALETTE[1], label="since the start")
    ceiling_line(ax, ceiling, [y for line in ax.get_lines() for y in line.get_ydata() if y is not None],
                 "infinite cache, whole replay")
    ax.set_xlabel("wall time since the replay started (s)")
    ax.set_ylabel("block hit ratio (all replicas)")
    ax.set_title("cluster block hit ratio over the replay", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")


def _ttft(ax, summary: dict, records) -> None:
    ttfts = sorted(r.ttft_s for r in records if r.status == 200)
    if ttfts:
        ax.plot(ttfts, [i / len(ttfts) for i in range(1, len(ttfts) + 1)], color=PALETTE[2], label="all requests")
        if ttfts[0] > 0:
            import matplotlib.ticker as mticker

            ax.set_xscale("log")
            # labels at 1, 2 and 5 of each decade, read as durations; matplotlib's own minor labels (2x10^-2,
            # 3x10^-2, ...) overlap on a span under a decade
            ax.xaxis.set_major_locator(mticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(mticker.FuncFormatter(lambda v, _pos: duration_text(v)))
            ax.xaxis.set_minor_formatter(mticker.NullFormatter())
        for q, ls in (("p50", ":"), ("p99", "--")):
            v = summary[f"ttft_{q}_s"]
            ax.axvline(v, color=CEILING, ls=ls, lw=1.2, label=f"{q} = {duration_text(v)}")
        ax.legend(fontsize=8, loc="lower right")
    ax.set_ylim(0, 1.02)
    ax.set_title("emulated time to first token (CDF)", fontsize=10)
    ax.set_xlabel("TTFT (emulated; log scale when all are above 0)")
    ax.set_ylabel("fraction of requests with TTFT ≤ x")
    ax.grid(alpha=0.3)


def replay_figure(summary: dict, records, ctx: dict):
    plt = pyplot()
    agents = (summary.get("agent_sessions") or {}).get("paths")  # an agent trace: a panel of its sessions
    fig, axes = plt.subplots(1, 4 if agents else 3, figsize=(23 if agents else 17, 5))
    ceiling = ctx.get("ceiling")
    _per_replica(axes[0], summary, ceiling)
    _over_time(axes[1], records, ceiling)
    _ttft(axes[2], summary, records)
    if agents:
        from loadgen.critical_path_plots import critical_path_panel

        critical_path_panel(axes[3], agents)
    fig.suptitle(context_line(ctx), fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    thin_overlapping_ticks(fig)
    return fig


def plot_replay(summary: dict, records, path: str, ctx: dict | None = None) -> None:
    """Write the replay figure (see the module docstring) to ``path``."""
    plt = pyplot()
    fig = replay_figure(summary, records, ctx or {})
    fig.savefig(path, dpi=100)
    plt.close(fig)
