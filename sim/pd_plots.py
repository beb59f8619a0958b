"""The figures of disaggregated prefill / decode (matplotlib, imported on demand): the study of
bench/bench_pd.py (docs/pd.md) and one P/D run's TTFT split and pools (``plot_pd_runs``)."""

from __future__ import annotations

import os

from shared.plotting import PALETTE, pyplot, save_figure

PARTS = ("queue", "prefill", "transfer", "first_decode")
PART_LABELS = {"queue": "queue (prefill instance)", "prefill": "prefill", "transfer": "KV transfer",
               "first_decode": "first decode step"}
PART_COLORS = dict(zip(PARTS, (PALETTE[7], PALETTE[0], PALETTE[3], PALETTE[2])))
WORKLOAD_TITLES = {"chat": "chat preset", "agent": "agent preset", "mooncake": "Mooncake conversation trace"}


def _ms(seconds: float | None) -> float:
    return (seconds or 0.0) * 1000


def _log_x(ax, ticks: list[float], labels: list[str]) -> None:
    """A log x axis with only the given ticks labelled (no minor-tick labels)."""
    import matplotlib.ticker as mticker

    ax.set_xscale("log")
    ax.set_xticks(ticks, labels)
    ax.xaxis.set_minor_formatter(mticker.NullFormatter())


def _objective(doc: dict, w: str) -> str:
    o = doc["objectives"][w]
    return f"TTFT p99 <= {o['ttft_p99_s']:g} s, TPOT p99 <= {o['tpot_p99_s'] * 1000:g} ms"


def goodput_figure(doc: dict):
    """Per workload, the highest request rate meeting both objectives, one bar per configuration."""
    plt = pyplot()
    goodput = doc["goodput"]
    fig, axes = plt.subplots(1, len(goodput), figsize=(5.2 * len(goodput), 4.6), squeeze=False)
    for ax, (w, configs) in zip(axes[0], goodput.items()):
        names = list(configs)
        values = [configs[n]["goodput_rps"] for n in names]
        colors = ["0.35" if n == "colocated" else PALETTE[1 + ("always" in n)] for n in names]
        bars = ax.barh(names, values, color=colors)
        ax.invert_yaxis()
        top = max(values, default=0) or 1.0
        for bar, n, v in zip(bars, names, values):
            mark = "+" if configs[n]["capped"] else ""
            ax.text(v + top * 0.01, bar.get_y() + bar.get_height() / 2, f"{v:.3g}{mark}", va="center", fontsize=8)
        ax.set_xlim(0, top * 1.18)
        ax.set_xlabel("goodput (requests/s meeting both objectives)")
        ax.set_title(f"{WORKLOAD_TITLES.get(w, w)}\n{_objective(doc, w)}", fontsize=9)
        ax.grid(axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in ("0.35", PALETTE[1], PALETTE[2])]
    fig.legend(handles, ["colocated (4 replicas)", "P/D, prefix decider (llm-d's, the default)",
                         "P/D, --pd-decider always"], loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.suptitle(f"Goodput at the same GPU count ({doc['gpus']} x {doc['gpu'].split()[0]}, {doc['model'].split()[0]})",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def _split_bars(ax, labels: list[str], splits: list[dict | None], ttfts: list[float | None],
                quantile: str = "p50") -> None:
    """Stacked bars of the TTFT parts' quantile (ms), with the whole TTFT's same quantile as a marker."""
    left = [0.0] * len(labels)
    for part in PARTS:
        widths = [_ms(s[f"{part}_{quantile}_s"]) if s else 0.0 for s in splits]
        ax.barh(labels, widths, left=left, color=PART_COLORS[part], label=PART_LABELS[part])
        left = [a + b for a, b in zip(left, widths)]
    ax.plot([_ms(t) for t in ttfts], range(len(labels)), "kd", ms=6, label="TTFT of every request, same quantile")
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    ax.set_xlabel(f"milliseconds (emulated), {quantile} of each part stacked")


def ttft_split_figure(doc: dict):
    """Per workload, at each configuration's goodput: each part of a remote-prefill request's TTFT, its
    p50 (top row) and its p99 (bottom row)."""
    plt = pyplot()
    goodput = doc["goodput"]
    fig, axes = plt.subplots(2, len(goodput), figsize=(5.6 * len(goodput), 8.4), squeeze=False)
    for col, (w, configs) in enumerate(goodput.items()):
        names = [n for n in configs if configs[n]["at_goodput"]]
        ats = [configs[n]["at_goodput"] for n in names]
        labels = [f"{n}\n{a['rps']:.3g} req/s" for n, a in zip(names, ats)]
        splits = [a.get("pd", {}).get("ttft_split") for a in ats]
        for row, q in enumerate(("p50", "p99")):
            ax = axes[row][col]
            _split_bars(ax, labels, splits, [a[f"ttft_{q}_s"] for a in ats], q)
            ax.set_title(f"{WORKLOAD_TITLES.get(w, w)}: TTFT {q}, at each configuration's goodput", fontsize=9)
            ax.tick_params(axis="y", labelsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle("TTFT split of remote-prefill requests (colocated: no split, its TTFT only; the parts' quantiles"
                 " stacked need not add up to the TTFT's)", fontsize=11)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def link_figure(doc: dict):
    """The transfer link's bandwidth: the TTFT split at one load, and the goodput."""
    plt = pyplot()
    link = doc["link"]
    gbps = list(link["gbps"])
    fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(17, 4.8))
    ats = [link["gbps"][g]["at_rate"] for g in gbps]
    labels = [f"{g} Gb/s" for g in gbps]
    rate = link["rate"]
    for ax, q in ((ax0, "p50"), (ax1, "p99")):
        _split_bars(ax, labels, [a["pd"]["ttft_split"] if a else None for a in ats],
                    [a[f"ttft_{q}_s"] if a else None for a in ats], q)
        ax.set_title(f"TTFT split, {q}, at {rate:g}x the trace's rate\n(2P:2D's goodput at the default 400 Gb/s)",
                     fontsize=9)
    xs = [float(g) for g in gbps]
    good = [link["gbps"][g]["goodput"]["goodput_rps"] if link["gbps"][g]["goodput"] else None for g in gbps]
    ax2.plot(xs, good, marker="o", color=PALETTE[1], label="goodput")
    util = [a["pd"]["busiest_link_utilization"] * 100 if a else None for a in ats]
    _log_x(ax2, xs, [f"{g:g}" for g in xs])
    ax2.set_xlabel("each instance's NIC (Gb/s per direction, --pd-link-gbps)")
    ax2.set_ylabel("goodput (requests/s meeting both objectives)")
    ax2.set_ylim(0, max([g for g in good if g] + [0.1]) * 1.25)
    ax2.grid(alpha=0.3)
    twin = ax2.twinx()
    twin.plot(xs, util, marker="s", ls="--", color=PALETTE[3], label="busiest NIC direction busy, % (at the one load)")
    twin.set_ylabel("busiest NIC direction busy (% of the run)")
    twin.set_ylim(0, max([u for u in util if u is not None] + [1.0]) * 1.25)
    h1, l1 = ax2.get_legend_handles_labels()
    h2, l2 = twin.get_legend_handles_labels()
    ax2.legend(h1 + h2, l1 + l2, fontsize=8, loc="center right")
    ax2.set_title(f"Goodput by link bandwidth ({_objective(doc, link['workload'])})", fontsize=9)
    handles, labels = ax0.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle(f"The KV transfer link: {link['config']} on the {WORKLOAD_TITLES.get(link['workload'])}", fontsize=11)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def routing_figure(doc: dict):
    """cache_aware against round_robin on the prefill pool: its hit ratio and the TTFT."""
    plt = pyplot()
    rows = [(w, c, v) for w, by in doc["routing"].items() for c, v in by.items()]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 0.9 * len(rows) + 2.2))
    labels = [f"{w}, {c}" for w, c, _ in rows]
    ys = range(len(rows))
    h = 0.38
    for i, strat in enumerate(("cache_aware", "round_robin")):
        hits = [v[strat]["pd"]["pools"]["prefill"]["token_hit_ratio"] for _, _, v in rows]
        p99 = [v[strat]["ttft_p99_s"] * 1000 for _, _, v in rows]
        off = [y + (i - 0.5) * h for y in ys]
        ax1.barh(off, hits, height=h, color=PALETTE[i], label=strat)
        for x, y, (_, _, v) in zip(p99, off, rows):
            ax2.plot([x], [y], "o", color=PALETTE[i], ms=7, mfc=PALETTE[i] if v[strat]["meets"] else "white")
        ax2.plot([], [], "o", color=PALETTE[i], ms=7, label=strat)
    for ax in (ax1, ax2):
        ax.set_yticks(list(ys), labels, fontsize=8)
        ax.invert_yaxis()
        ax.grid(axis="x", alpha=0.3)
    ax1.set_xlabel("prefill pool's token hit ratio (HBM)")
    ax1.set_xlim(0, 1)
    ax2.set_xscale("log")
    ax2.grid(axis="x", which="minor", alpha=0.15)
    ax2.set_xlabel("TTFT p99 (ms, emulated; log scale)")
    ax1.legend(fontsize=8, title="--prefill-routing", title_fontsize=8)
    ax2.plot([], [], "o", color="0.4", mfc="white", ms=7, label="hollow: misses an objective")
    ax2.legend(fontsize=8, loc="lower right")
    fig.suptitle("Routing on the prefill pool, at each configuration's goodput load (decode pool: cache_aware)",
                 fontsize=11)
    fig.tight_layout()
    return fig


def estimate_figure(doc: dict):
    """The mean-field estimate's hit ratio against capacity, and the simulator's with one prefill instance."""
    from sim.estimate import ScmModel, estimate

    plt = pyplot()
    est = doc["estimate"]
    model = ScmModel(**est["params"])
    pts = est["points"]
    caps = sorted({p["capacity_blocks"] for p in pts})
    lo, hi = min(caps) * 0.8, max(caps) * 1.25
    grid = [lo * (hi / lo) ** (i / 80) for i in range(81)]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [3, 2]})
    ax1.plot(grid, [estimate(model.workload(), int(c)).hit_ratio for c in grid], color="k", lw=1.5,
             label="mean-field estimate (kvemu estimate)")
    ax1.axhline(model.continue_prob, color="0.6", ls=":", lw=1, label=f"h_max = p = {model.continue_prob:g}")
    styles = {"pd": ("o", PALETTE[1], "kvemu sim, 1 prefill instance, --pd-decider always (prefill pool)"),
              "colocated": ("s", PALETTE[0], "kvemu sim, 1 colocated replica, --response-kv drop")}
    for mode, (marker, color, label) in styles.items():
        mine = sorted((p for p in pts if p["mode"] == mode), key=lambda p: p["capacity_blocks"])
        ax1.plot([p["capacity_blocks"] for p in mine], [p["sim_steady"] for p in mine], marker=marker, ls="none",
                 color=color, ms=7 if mode == "pd" else 5, mfc="none" if mode == "colocated" else color, label=label)
        ax2.plot([p["capacity_blocks"] for p in mine], [p["difference"] for p in mine], marker=marker, color=color,
                 mfc="none" if mode == "colocated" else color, label=label.split(",")[1].strip())
    for ax in (ax1, ax2):
        _log_x(ax, caps, [f"{c:,}" for c in caps])
        ax.set_xlabel("KV capacity (blocks of 16 tokens)")
        ax.grid(alpha=0.3)
    ax1.set_ylabel("block hit ratio (HBM, steady state)")
    ax1.set_ylim(0, 1)
    ax1.legend(fontsize=7, loc="upper left")
    ax2.axhline(0, color="k", lw=0.8)
    lim = max(0.03, max(abs(p["difference"]) for p in pts) * 1.3)
    ax2.set_ylim(-lim, lim)
    ax2.set_ylabel("simulated - estimated hit ratio")
    ax2.legend(fontsize=7)
    ax2.set_title("difference", fontsize=9)
    p = est["params"]
    ax1.set_title(f"scm preset: lambda {p['arrival_rate']:g} sessions/s, E[think] {p['think_mean']:g} s, "
                  f"p {p['continue_prob']:g}, {p['prompt_blocks']} + {p['response_blocks']} blocks a turn; "
                  f"{est['policy']}", fontsize=9)
    fig.suptitle("The mean-field LRU estimate against the simulator with one prefill instance", fontsize=11)
    fig.tight_layout()
    return fig


def plot_study(doc: dict, folder: str) -> list[str]:
    """Every figure the study's document has parts for, as ``folder/pd-*.png``; the paths written."""
    out = []
    for key, name, make in (("goodput", "pd-goodput.png", goodput_figure),
                            ("goodput", "pd-ttft-split.png", ttft_split_figure),
                            ("link", "pd-link.png", link_figure), ("routing", "pd-routing.png", routing_figure),
                            ("estimate", "pd-estimate.png", estimate_figure)):
        if doc.get(key):
            out.append(save_figure(make(doc), os.path.join(folder, name)))
    return out


# ---------------------------------------------------------------- one `kvemu sim` run


def pd_runs_figure(runs: list[dict], source: str):
    """``kvemu sim --plot`` for P/D runs: per run (policy @ capacity) the TTFT split, and per pool
    the hit ratio, KV use and busy fraction."""
    plt = pyplot()
    runs = [r for r in runs if r.get("pd")]
    fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(17, 1.0 * len(runs) + 3.2))
    labels = [f"{r['policy']} @ {r['capacity_blocks']:,}" for r in runs]
    for ax, q in ((ax0, "p50"), (ax1, "p99")):
        _split_bars(ax, labels, [r["pd"]["ttft_split"] for r in runs], [r[f"ttft_{q}_s"] for r in runs], q)
        ax.set_title(f"TTFT split of remote-prefill requests, {q}", fontsize=9)
    ax0.legend(fontsize=7, loc="lower right")
    metrics = (("token_hit_ratio", "token hit ratio (HBM)"), ("kv_usage_mean", "mean KV use"),
               ("busy_fraction", "busy fraction"))
    rows = [(lab, role, pool) for lab, r in zip(labels, runs) for role, pool in r["pd"]["pools"].items()]
    h = 0.8 / len(metrics)
    for i, (key, name) in enumerate(metrics):
        ax2.barh([y + (i - 1) * h for y in range(len(rows))], [pool[key] for _, _, pool in rows], height=h,
                 color=PALETTE[i], label=name)
    ax2.set_yticks(range(len(rows)), [f"{lab}\n{role} x{pool['replicas']}" for lab, role, pool in rows], fontsize=7)
    ax2.invert_yaxis()
    ax2.set_xlim(0, 1)
    ax2.set_xlabel("fraction")
    ax2.set_title("per pool", fontsize=9)
    ax2.legend(fontsize=7, loc="lower right")
    for ax in (ax1, ax2):
        ax.grid(axis="x", alpha=0.3)
    topo = runs[0]["pd"]["topology"]
    fig.suptitle(f"{source}: P/D {topo['prefill']}P:{topo['decode']}D"
                 + (f" + {topo['colocated']} colocated" if topo["colocated"] else "")
                 + f", decider {runs[0]['pd']['decider']}; {runs[0]['model']} on {runs[0]['gpu']}", fontsize=11)
    fig.tight_layout()
    return fig


def plot_pd_runs(runs: list[dict], path: str, source: str = "trace") -> None:
    save_figure(pd_runs_figure(runs, source), path)
