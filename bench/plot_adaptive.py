"""Plot bench_adaptive.py's JSON: per mix, the hit ratio of every policy (Belady as the ceiling)
and the regret of the online ones (points of hit ratio behind the better static policy).

    .venv/bin/python bench/bench_adaptive.py --jobs 2 > adaptive.json
    .venv/bin/python bench/plot_adaptive.py adaptive.json docs/adaptive-regret.png
"""

from __future__ import annotations

import json
import sys

from shared.plotting import PALETTE, pyplot

LABELS = {"lru": "LRU", "s3fifo": "S3-FIFO", "belady": "Belady (offline optimum)", "adaptive": "adaptive (defaults)",
          "adaptive_plain": "adaptive, seed's rule", "adaptive_sampled": "adaptive, sampled shadows"}


def main(argv: list[str]) -> int:
    doc = json.load(open(argv[0]))
    part = doc["mixes"]
    mixes = part["mixes"]
    names = list(part["summary"])
    online = [n for n in names if n != "belady"]
    plt = pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(12, 7.5), sharex=True)
    xs = range(len(mixes))
    for k, name in enumerate(names):
        style = "_" if name == "belady" else "o"
        color = "black" if name == "belady" else PALETTE[k % len(PALETTE)]
        shift = 0 if name == "belady" else (k - (len(online) - 1) / 2) * 0.08
        top.plot([x + shift for x in xs], [m["policies"][name]["hit_ratio"] for m in mixes], style, color=color, markersize=7 if
                 name != "belady" else 14, alpha=0.85, label=LABELS.get(name, name))
    top.set_ylabel("block hit ratio (prefix cache)")
    top.set_title(f"Hit ratio per mix: {doc['duration_s'] / 60:g} min of traffic each, "
                  f"{doc['capacity_blocks']:,} blocks, decision interval {doc['interval_s']:.0f} s")
    top.legend(fontsize=8, ncol=3)
    top.grid(axis="y", alpha=0.3)
    width = 0.8 / len(online)
    for k, name in enumerate(online):
        s = part["summary"][name]
        bx = [i + (k - (len(online) - 1) / 2) * width for i in xs]
        bottom.bar(bx, [m["policies"][name]["regret_points"] for m in mixes], width, color=PALETTE[k % len(PALETTE)],
                   label=f"{LABELS.get(name, name)}: mean {s['mean_regret_points']:.2f}, "
                         f"max {s['max_regret_points']:.2f}")
    bottom.set_xticks(list(xs))
    bottom.set_xticklabels([f"{m['mix']['single']:.2f}/{m['mix']['multi']:.2f}/{m['mix']['agent']:.2f}\n"
                            f"{'S3' if m['winner'] == 's3fifo' else 'LRU'} +{m['static_gap_points']:.1f}"
                            for m in mixes], rotation=60, fontsize=7)
    bottom.set_xlabel("mix: single / multi-turn / agentic session fractions; better static policy and its lead (points)")
    bottom.set_ylabel("regret (points of hit ratio)")
    bottom.set_title("Regret vs the better of LRU and S3-FIFO (lower is better)")
    bottom.legend(fontsize=8, ncol=2)
    bottom.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(argv[1], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
