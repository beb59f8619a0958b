"""The figures of `kvemu sim --plot` and `kvemu sweep --plot` on small real runs, read back
through matplotlib's objects: titles naming the trace, replicas and model/GPU, labelled axes,
legends that explain every line, the infinite-cache ceiling unclipped, distinct colours."""

from __future__ import annotations

import pytest
from matplotlib.colors import to_hex

from kvemu.cli import main
from loadgen.formats import read_trace
from loadgen.source import trace_name
from loadgen.trace import infinite_cache_hit_ratio
from replica.core.build import EngineKnobs
from shared.plotting import PALETTE, REPLICA_BAR, REPLICA_LINE, pyplot
from sim.plots import capacity_figure
from sim.run import simulate
from sim.simulator import SimSettings
from sim.sweep import mean_field, read_records
from sim.sweep_plots import sweep_figure
from tests.support.plots import ceiling_of, check_readable, legend_labels, line_colors

PREFIX = "hits: only the cached prefix of a prompt hits (prefix mode)"  # the default hit mode, vLLM's
CAPS = (600, 1200, 2400)


@pytest.mark.parametrize("replicas,routing,where", [(1, "cache_aware", "1 replica"),
                                                    (2, "session", "2 replicas, session routing")])
def test_sim_figure(trace_file, tmp_path, replicas, routing, where):
    trace = read_trace(trace_file)
    runs = [simulate(trace, SimSettings(capacity_blocks=c, replicas=replicas, routing=routing,
                                        knobs=EngineKnobs(policy=p)))
            for p in ("lru", "s3fifo") for c in CAPS]
    ceiling = infinite_cache_hit_ratio(trace.requests)
    fig = capacity_figure(runs, trace_name(trace.source), ceiling)
    try:
        check_readable(fig)
        assert fig._suptitle.get_text() == f"scm.jsonl: lru, s3fifo by capacity; {where}; qwen3-coder-30b-a3b on h200"
        hit, csr = fig.axes
        assert (hit.get_title(), csr.get_title()) == ("block hit ratio (HBM)", "compute-savings ratio (CSR)")
        assert hit.get_xlabel() == csr.get_xlabel() == "KV capacity per replica (blocks of 16 tokens)"
        assert hit.get_ylabel() == "fraction of block accesses found in HBM"
        assert csr.get_ylabel() == "CSR (prefill compute saved / total)"
        assert [t.get_text() for t in hit.get_xticklabels()] == ["600", "1.2K", "2.4K"]
        assert [t.get_text() for t in fig.legends[0].get_texts()] == ["lru", "s3fifo",
                                                                     f"infinite cache: {ceiling:.3f}", PREFIX]
        assert ceiling_of(hit) == pytest.approx(ceiling)
        assert max(r["block_hit_ratio"] for r in runs) < hit.get_ylim()[1]
        colors = line_colors(hit)
        assert colors["lru"] != colors["s3fifo"] and {colors["lru"], colors["s3fifo"]} <= set(PALETTE)
        fig.savefig(tmp_path / "sim.png")
    finally:
        pyplot().close(fig)


def test_sweep_figure(trace_file, tmp_path):
    out, png = tmp_path / "sweep.jsonl", tmp_path / "sweep.png"
    assert main(["sweep", "--trace", str(trace_file), "--policy", "lru,s3fifo", "--capacity-blocks",
                 ",".join(map(str, CAPS)), "--routing", "cache_aware,session", "--replicas", "1,2", "--jobs", "2",
                 "--quiet", "--out", str(out), "--plot", str(png)]) == 0
    assert png.stat().st_size > 20_000
    records, _ = read_records(str(out))
    grid = sorted((r for r in records.values() if r["kind"] == "grid"),
                  key=lambda r: (r["replicas"], r["routing"], r["policy"], r["capacity_blocks"]))
    mrc = [r for r in records.values() if r["kind"] != "grid"]
    trace = read_trace(trace_file)
    ceiling = infinite_cache_hit_ratio(trace.requests)
    fig = sweep_figure(grid, mrc, mean_field(trace, None, {}), ceiling)
    try:
        check_readable(fig)
        assert fig._suptitle.get_text() == ("scm.jsonl: lru, s3fifo by capacity; qwen3-coder-30b-a3b on h200, "
                                            "max_running 256")
        titled = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
        wheres = ("1 replica", "2 replicas, cache_aware routing", "2 replicas, session routing")
        for where in wheres:  # one 1-replica panel, not one per routing
            hit = titled[f"block hit ratio, {where}"]
            assert ceiling_of(hit) == pytest.approx(ceiling)
            assert hit.get_ylabel() == "fraction of block accesses found in HBM"
            assert titled[f"compute-savings ratio, {where}"].get_ylabel() == "CSR (prefill compute saved / total)"
            ttft = titled[f"time to first token, {where}\np50 solid, p99 dashed"]
            assert ttft.get_ylabel() == "TTFT (s, emulated)"
            assert len(ttft.get_lines()) == 4  # p50 and p99 of two policies
        assert len([t for t in titled if t.startswith("block hit ratio")]) == 3
        legend_ax = next(ax for ax in fig.axes if not ax.axison)
        assert legend_labels(legend_ax) == ["lru", "s3fifo", "LRU, from reuse distances (miss-ratio curve)",
                                            "LRU estimate, mean-field (from trace statistics)",
                                            f"infinite cache: {ceiling:.3f}", PREFIX]
        load = next(ax for t, ax in titled.items() if t.startswith("per replica:"))
        run = next(r for r in grid if r["replicas"] == 2 and r["routing"] == "cache_aware" and r["policy"] == "lru"
                   and r["capacity_blocks"] == 2400)
        assert load.get_title() == ("per replica: lru at 2,400 blocks\n2 replicas, cache_aware routing "
                                    f"(imbalance {run['load_imbalance']:.2f})")  # two lines: fits its panel
        assert legend_labels(load) == ["requests routed (bars, left axis)", "block hit ratio, HBM (line, right axis)"]
        policy_colors = set(line_colors(titled["block hit ratio, 1 replica"], ("_", "LRU", "infinite")).values())
        assert len(policy_colors) == 2
        assert to_hex(load.patches[0].get_facecolor()) == REPLICA_BAR.lower() not in policy_colors
        twin = next(ax for ax in fig.axes if ax is not load and ax.bbox.bounds == load.bbox.bounds)
        assert to_hex(twin.get_lines()[0].get_color()) == REPLICA_LINE not in policy_colors
    finally:
        pyplot().close(fig)
