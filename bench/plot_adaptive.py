"""Plot bench_adaptive.py's JSON: per mix, the hit ratio of every policy (Belady as the ceiling)
and the regret of the online ones (points of hit ratio behind the better static policy); print
the markdown tables of every part the documents hold.

    .venv/bin/python bench/bench_adaptive.py --jobs 2 > adaptive.json
    .venv/bin/python bench/plot_adaptive.py adaptive.json --png docs/adaptive-regret.png

The bench runs with response KV kept and dropped by default: one column of the figure, and one set of
tables, per mode.
"""

from __future__ import annotations

import argparse
import json
import sys

from shared.plotting import PALETTE, pyplot

LABELS = {"lru": "LRU", "s3fifo": "S3-FIFO", "belady": "Belady (offline optimum)", "adaptive": "adaptive (defaults)",
          "adaptive_plain": "adaptive, WAKMan's rule", "adaptive_sampled": "adaptive, sampled shadows"}


def modes(doc: dict) -> dict[str, dict]:
    """The parts per response-KV mode (``response_kv``: keep, drop); a document from before the bench ran
    both ways holds its parts at its top level (response KV kept, the default it ran with)."""
    if "response_kv" in doc:
        return doc["response_kv"]
    return {"keep": doc}


def _panels(top, bottom, doc: dict, part: dict, mode: str) -> None:
    mixes = part["mixes"]
    names = list(part["summary"])
    online = [n for n in names if n != "belady"]
    xs = range(len(mixes))
    for k, name in enumerate(names):
        style = "_" if name == "belady" else "o"
        color = "black" if name == "belady" else PALETTE[k % len(PALETTE)]
        shift = 0 if name == "belady" else (k - (len(online) - 1) / 2) * 0.08
        top.plot([x + shift for x in xs], [m["policies"][name]["hit_ratio"] for m in mixes], style, color=color, markersize=7 if
                 name != "belady" else 14, alpha=0.85, label=LABELS.get(name, name))
    top.set_ylabel("block hit ratio (prefix cache)")
    top.set_title(f"Response KV {'kept' if mode == 'keep' else 'dropped'}: hit ratio per mix "
                  f"({doc['duration_s'] / 60:g} min each, {doc['capacity_blocks']:,} blocks, interval {doc['interval_s']:.0f} s)",
                  fontsize=10)
    top.legend(fontsize=8, ncol=2, loc="lower left", framealpha=1)
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
    bottom.set_xlabel("mix: single / multi-turn / agentic fractions; better static policy, its lead (points)", fontsize=9)
    bottom.set_ylabel("regret (points of hit ratio)")
    bottom.set_title(f"Response KV {'kept' if mode == 'keep' else 'dropped'}: regret vs the better of LRU and S3-FIFO "
                     "(lower is better)", fontsize=10)
    bottom.legend(fontsize=8, ncol=1)
    bottom.grid(axis="y", alpha=0.3)


def plot(doc: dict, path: str) -> None:
    """Per mix, hit ratios above and regrets below; one column per response-KV mode the document holds."""
    runs = {m: parts for m, parts in modes(doc).items() if "mixes" in parts}
    plt = pyplot()
    fig, axes = plt.subplots(2, len(runs), figsize=(9 * len(runs), 8), sharex="col", squeeze=False)
    for col, (mode, parts) in enumerate(runs.items()):
        _panels(axes[0][col], axes[1][col], doc, parts["mixes"], mode)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def fmt_mix(m) -> str:
    return f"{m['single']:.2f} / {m['multi']:.2f} / {m['agent']:.2f}"


def tables(doc: dict) -> str:
    """Markdown tables of whatever parts the document holds, per response-KV mode (what
    docs/choosing-a-policy.md shows)."""
    out = []
    for mode, parts in modes(doc).items():
        out.append(f"### response KV {mode}\n")
        out.append(mode_tables(parts))
    return "\n".join(out)


def mode_tables(doc: dict) -> str:
    out = []
    if "mixes" in doc:
        part = doc["mixes"]
        names = list(part["summary"])
        n_mixes = len(part["mixes"])
        out.append("| single / multi / agent | " + " | ".join(LABELS.get(n, n) for n in names) + " | better static, lead |")
        out.append("|---" * (len(names) + 2) + "|")
        for m in part["mixes"]:
            cells = [f"{m['policies'][n]['hit_ratio']:.4f}" for n in names]
            out.append(f"| {fmt_mix(m['mix'])} | " + " | ".join(cells) + f" | {m['winner']} +{m['static_gap_points']:.2f} |")
        rows = [("mean regret (points)", "mean_regret_points", "{:.2f}"), ("max regret (points)", "max_regret_points", "{:.2f}"),
                ("mean regret (% of the better static)", "mean_regret_pct", "{:.2f}"),
                ("max regret (% of the better static)", "max_regret_pct", "{:.1f}"),
                ("median gap recovered, statics > 1 point apart", "median_gap_recovered_gt1pt", "{:.0%}"),
                ("mean gap to Belady (points)", "mean_gap_to_belady_points", "{:.2f}"),
                (f"shadow CPU, {n_mixes} runs (s)", "shadow_cpu_s", "{:.1f}"), (f"switches, {n_mixes} runs", "switches", "{}"),
                (f"wall time, {n_mixes} runs (s)", "wall_s", "{:.0f}")]
        for label, key, f in rows:
            vals = [part["summary"][n].get(key) for n in names]
            if all(v is None for v in vals):  # e.g. the gap to Belady in a run without it
                continue
            out.append(f"| **{label}** | " + " | ".join("" if v is None else f.format(v) for v in vals) + " | |")
        out.append(f"\nStatic wins: LRU {part['wins']['lru']}, S3-FIFO {part['wins']['s3fifo']}.\n")
    if "ablations" in doc:
        names = list(doc["ablations"][0]["policies"])
        out.append("| mix | parameter | " + " | ".join(LABELS.get(n, n) for n in names) + " | better static, lead |")
        out.append("|---" * (len(names) + 3) + "|")
        for r in doc["ablations"]:
            cells = [f"{r['policies'][n]['hit_ratio']:.4f}" for n in names]
            out.append(f"| {fmt_mix(r['mix'])} | {r['ablation']} | " + " | ".join(cells)
                       + f" | {r['winner']} +{r['static_gap_points']:.2f} |")
        out.append("")
    if "shift" in doc:
        sh = doc["shift"]
        out.append("| policy | hit ratio | regret (points) | switches | runs each phase's winner after (s) "
                   "| within two intervals |")
        out.append("|---|---|---|---|---|---|")
        for n, r in sh["policies"].items():
            delays = " / ".join("never" if d is None else f"{d:.0f}" for d in r.get("follow_delay_s", []))
            follows = " / ".join("yes" if f else "no" for f in r.get("follows_within_two_intervals", []))
            out.append(f"| {LABELS.get(n, n)} | {r['hit_ratio']:.4f} | {r['regret_points']:.2f} | {r.get('switches', '')} "
                       f"| {delays} | {follows} |")
        out.append("\nPhases alone: " + ", ".join(f"{p['phase']} {p['winner_alone']} +{p['static_gap_points']:.2f}"
                                                   for p in sh["phases"]) + "\n")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("json", nargs="+", help="bench_adaptive.py output(s); parts run apart are merged")
    p.add_argument("--png", help="where to draw the per-mix figure (needs the mixes part)")
    args = p.parse_args(argv)
    doc: dict = {}
    for path in args.json:  # parts run apart: merged per mode
        one = json.load(open(path))
        for mode, parts in modes(one).items():
            doc.setdefault("response_kv", {}).setdefault(mode, {}).update(parts)
        doc.update({k: v for k, v in one.items() if k != "response_kv"})
    if args.png:
        plot(doc, args.png)
    print(tables(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
