"""Plot bench_adaptive.py's JSON: regret (points of hit ratio behind the better static policy) per mix.

    .venv/bin/python bench/bench_adaptive.py ... > adaptive.json
    .venv/bin/python bench/plot_adaptive.py adaptive.json docs/adaptive-regret.png
"""

from __future__ import annotations

import json
import sys

from shared.plotting import PALETTE, pyplot


def main(argv: list[str]) -> int:
    doc = json.load(open(argv[0]))
    mixes = doc["mixes"]
    names = list(doc["summary"])
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 4.2))
    width = 0.8 / len(names)
    for k, name in enumerate(names):
        xs = [i + (k - (len(names) - 1) / 2) * width for i in range(len(mixes))]
        mean = doc["summary"][name]["mean_regret_points"]
        ax.bar(xs, [m["policies"][name]["regret_points"] for m in mixes], width, color=PALETTE[k % len(PALETTE)],
               label=f"{name} (mean {mean:.2f})")
    ax.set_xticks(range(len(mixes)))
    ax.set_xticklabels([f"{m['mix']['single']:.2f}/{m['mix']['multi']:.2f}/{m['mix']['agent']:.2f}" for m in mixes],
                       rotation=60, fontsize=7)
    ax.set_xlabel("mix: single / multi-turn / agentic session fractions")
    ax.set_ylabel("regret (points of block hit ratio)")
    ax.set_title(f"Regret vs the better of LRU and S3-FIFO, {doc['capacity_blocks']:,} blocks, "
                 f"{doc['duration_s']:.0f} s per mix, interval {doc['interval_s']:.0f} s")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(argv[1], dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
