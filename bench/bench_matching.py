"""What a matching mode is worth: vLLM's blocks of 16 and commercial APIs' chunks of 1,024 tokens against
SGLang's radix tree with pages of 1 and 16, on the same requests, in `kvemu sim` with its defaults.

Per source (the generated ``chat`` and ``agent`` presets, and ``--log FILE``: recorded OpenAI chat or
completions bodies, one a line) and per capacity (``--capacities``, GiB of KV per replica), each mode is
one `kvemu sim` run: ``--matching blocks --block-size 16`` (vLLM's default), ``--block-size 1024``,
``--matching radix`` (``--page-size 1``, SGLang's default) and ``--matching radix --page-size 16``.
Reported per run: the token hit ratio (prompt tokens served from cache / prompt tokens), TTFT p50 / p95,
requests refused (a pool of whole 1,024-token blocks holds up to 1,023 tokens less), and the wall time.

    .venv/bin/python bench/bench_matching.py --json docs/matching/matching.json --plot docs/matching.png
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from shared.progress import ProgressBar  # noqa: E402

MODES = {
    "blocks-16": ["--matching", "blocks", "--block-size", "16"],
    "blocks-1024": ["--matching", "blocks", "--block-size", "1024"],
    "radix-1": ["--matching", "radix", "--page-size", "1"],
    "radix-16": ["--matching", "radix", "--page-size", "16"],
}
PRESETS = {  # minutes of session starts: a few thousand requests each, so that page size 1 stays quick
    "chat": ["--workload", "chat", "--duration", "600", "--set", "session_rate=1"],
    "agent": ["--workload", "agent", "--duration", "300", "--set", "session_rate=0.2", "--set", "tool_fanout_prob=0",
              "--set", "subagent_prob=0"],  # measured before the preset fanned out
}
KEYS = ("token_hit_ratio", "ttft_p50_s", "ttft_p95_s", "requests", "refused", "block_size", "matching",
        "capacity_blocks", "engine")


def run_cell(source: list[str], mode: str, gib: float, work: Path) -> dict:
    out = work / f"{abs(hash((tuple(source), mode, gib)))}.json"
    cmd = [sys.executable, "-m", "kvemu", "sim", *source, *MODES[mode], "--capacity-gib", str(gib),
           "--quiet", "--jobs", "1", "--json", str(out)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env={**os.environ, "KVEMU_CACHE_DIR": "off"})
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-1500:]}")
    run = json.loads(out.read_text())["runs"][0]
    return {**{k: run.get(k) for k in KEYS}, "wall_s": round(wall, 2)}


def plot(doc: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    sources = list(doc["results"])
    fig, axes = plt.subplots(2, len(sources), figsize=(4.8 * len(sources), 7.5), squeeze=False)
    colors = {"blocks-16": "#4c72b0", "blocks-1024": "#8172b2", "radix-1": "#dd8452", "radix-16": "#55a868"}
    for col, name in enumerate(sources):
        caps = list(doc["results"][name])
        width = 0.8 / len(MODES)
        for row, (key, label) in enumerate((("token_hit_ratio", "token hit ratio"), ("ttft_p95_s", "TTFT p95 (s, log scale)"))):
            ax = axes[row][col]
            for i, mode in enumerate(MODES):
                xs = [c + (i - (len(MODES) - 1) / 2) * width for c in range(len(caps))]
                ys = [doc["results"][name][cap][mode][key] or 0.0 for cap in caps]
                ax.bar(xs, ys, width, label=mode, color=colors[mode])
            ax.set_xticks(range(len(caps)), [f"{cap} GiB" for cap in caps])
            ax.set_ylabel(label)
            if key == "ttft_p95_s":  # a saturated replica's queue dwarfs the rest: a log scale shows both
                ax.set_yscale("log")
                ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
                ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
                ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set_xlabel("KV capacity per replica")
            if row == 0:
                ax.set_title(f"{name}")
                ax.set_ylim(0, 1)
            ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, title="matching", loc="lower center", ncol=len(MODES), fontsize=9)
    fig.suptitle("Prefix matching: vLLM blocks vs SGLang radix pages (kvemu sim, LRU, default model and GPU)")
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--capacities", default="8,32", help="GiB of KV per replica, comma-separated (default 8,32)")
    ap.add_argument("--sources", default="chat,agent", help=f"presets among {', '.join(PRESETS)}")
    ap.add_argument("--log", action="append", default=[], metavar="FILE",
                    help="a recorded request log (OpenAI bodies, one a line) to add as a source (repeatable)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--plot", metavar="FILE.png")
    a = ap.parse_args()
    caps = [float(c) for c in a.capacities.split(",") if c.strip()]
    sources = {name: PRESETS[name] for name in a.sources.split(",") if name}
    sources.update({Path(log).name: ["--trace", log, "--format", "openai"] for log in a.log})
    cells = [(name, cap, mode) for name in sources for cap in caps for mode in MODES]
    results: dict = {name: {f"{cap:g}": {} for cap in caps} for name in sources}
    bar = ProgressBar("bench_matching", len(cells), "runs")
    with tempfile.TemporaryDirectory(prefix="kvemu-matching-") as tmp, ThreadPoolExecutor(max(1, a.jobs)) as pool:
        futures = {pool.submit(run_cell, sources[name], mode, cap, Path(tmp)): (name, cap, mode)
                   for name, cap, mode in cells}
        for fut in as_completed(futures):
            name, cap, mode = futures[fut]
            results[name][f"{cap:g}"][mode] = fut.result()
            bar.update()
    bar.close()
    doc = {"modes": {m: " ".join(f) for m, f in MODES.items()},
           "sources": {n: " ".join(f) for n, f in sources.items()}, "results": results}
    for by_cap in results.values():  # the differences the docs quote, per capacity
        for row in by_cap.values():
            base = row["blocks-16"]["token_hit_ratio"] or 0.0
            row["radix-1 - blocks-16"] = round((row["radix-1"]["token_hit_ratio"] or 0.0) - base, 4)
            row["blocks-1024 - blocks-16"] = round((row["blocks-1024"]["token_hit_ratio"] or 0.0) - base, 4)
    text = json.dumps(doc, indent=1)
    print(text)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(text + "\n")
    if a.plot:
        plot(doc, a.plot)
        print(f"plot written to {a.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
