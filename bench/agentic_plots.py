"""The figures of bench/bench_agentic.py's study (docs/agentic.md): task time and TTFT by routing, arrival mode and
GPU; task time and TTFT against cluster size; and the agent sessions' critical paths under each arrival mode."""

from __future__ import annotations

import os

from loadgen.critical_path_plots import critical_path_panel
from shared.plotting import PALETTE, pyplot, save_figure

ROUTINGS = ("cache_aware", "session", "round_robin")
TTFT_OBJECTIVE_S = 2.0  # bench_agentic.TTFT_P99_S (bench/bench_pd.py's agent objective)
# (GPU, arrival mode) -> colour and hatch: a GPU a hue, recorded hatched
BARS = ((("h100", "recorded"), PALETTE[0], "//"), (("h100", "dependent"), PALETTE[0], ""),
        (("h200", "recorded"), PALETTE[1], "//"), (("h200", "dependent"), PALETTE[1], ""))


def plot_agentic(doc: dict, folder: str) -> list[str]:
    os.makedirs(folder, exist_ok=True)
    return [_by_routing(doc, folder), _capacity(doc, folder), _paths(doc, folder)]


def _find(doc: dict, **want) -> dict | None:
    return next((r for r in doc["runs"] if all(r[k] == v for k, v in want.items())), None)


def _by_routing(doc: dict, folder: str) -> str:
    plt = pyplot()
    workloads = list(dict.fromkeys(r["workload"] for r in doc["runs"] if r["study"] == "routing"))
    fig, axes = plt.subplots(len(workloads), 2, figsize=(12, 3.6 * len(workloads)), squeeze=False)
    width = 0.2
    for row, w in enumerate(workloads):
        for col, (key, label) in enumerate((("task", "agent task time (s): bar p99, dot p50"),
                                            ("ttft", "TTFT (s): bar p99, dot p50"))):
            ax = axes[row][col]
            for k, ((gpu, mode), colour, hatch) in enumerate(BARS):
                xs, p99, p50 = [], [], []
                for i, routing in enumerate(ROUTINGS):
                    r = _find(doc, study="routing", workload=w, gpu=gpu, arrivals=mode, routing=routing)
                    if r is None:
                        continue
                    a = r["agent_sessions"] or {}
                    xs.append(i + (k - 1.5) * width)
                    p99.append((a.get("task_p99_s") if key == "task" else r["ttft_p99_s"]) or 0.0)
                    p50.append((a.get("task_p50_s") if key == "task" else r["ttft_p50_s"]) or 0.0)
                ax.bar(xs, p99, width, color=colour if not hatch else "white", edgecolor=colour, hatch=hatch,
                       label=f"{gpu}, {mode} arrivals")
                ax.plot(xs, p50, "o", color="black", markersize=3)
            ax.set_xticks(range(len(ROUTINGS)), ROUTINGS)
            ax.set_ylabel(label, fontsize=9)
            ax.set_title(f"{w}, 8 replicas", fontsize=10)
            ax.grid(axis="y", alpha=0.3)
            if key == "ttft":
                ax.set_yscale("log")
            else:  # room above the bars for the legend
                ax.set_ylim(0, ax.get_ylim()[1] * 1.3)
        axes[row][0].legend(fontsize=8, loc="upper center", ncol=2)
    fig.suptitle("Agent task time and TTFT by routing: recorded vs dependent arrivals, H100 vs H200 replicas",
                 fontsize=11)
    fig.tight_layout()
    return save_figure(fig, os.path.join(folder, "agentic-task-time.png"))


def _capacity(doc: dict, folder: str) -> str:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for (gpu, mode), colour, hatch in BARS:
        c = next((x for x in doc["capacity"] if x["gpu"] == gpu and x["arrivals"] == mode), None)
        if c is None:
            continue
        style = "--" if hatch else "-"
        for ax, key in zip(axes, ("task_p99_s_by_replicas", "ttft_p99_s_by_replicas")):
            ns = sorted(int(n) for n in c[key])
            ax.plot(ns, [c[key].get(str(n), c[key].get(n)) for n in ns], style, marker="o", color=colour,
                    label=f"{gpu}, {mode} arrivals" if key.startswith("task") else None)
    axes[1].axhline(TTFT_OBJECTIVE_S, color="black", linewidth=0.8, linestyle=":",
                    label=f"TTFT p99 objective ({TTFT_OBJECTIVE_S:g} s)")
    for ax, label in zip(axes, ("agent task time p99 (s)", "TTFT p99 (s)")):
        ax.set_xlabel("replicas (cache_aware routing)")
        ax.set_ylabel(label)
        ax.set_xticks([2, 4, 8])
        ax.grid(alpha=0.3)
    axes[1].set_yscale("log")
    axes[0].set_title("agent task time p99", fontsize=10)
    axes[1].set_title("TTFT p99", fontsize=10)
    fig.suptitle("Agent preset: what each arrival mode says a cluster size gives", fontsize=11)
    fig.legend(loc="lower center", ncol=5, fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return save_figure(fig, os.path.join(folder, "agentic-capacity.png"))


def _paths(doc: dict, folder: str) -> str:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), sharex=True)
    # dependent arrivals only: under recorded ones a turn may arrive before the answer it follows, its tool time
    # negative and its queue overlapping the one before, so stacked parts would not draw the task time
    for ax, gpu in zip(axes, ("h100", "h200")):
        r = _find(doc, study="capacity", workload="agent", gpu=gpu, arrivals="dependent", routing="cache_aware",
                  replicas=2)
        if r is None:
            continue
        critical_path_panel(ax, r["paths"], f"agent preset, 2 {gpu.upper()} replicas (cache_aware), dependent arrivals")
    fig.tight_layout()
    return save_figure(fig, os.path.join(folder, "agentic-critical-path.png"))
