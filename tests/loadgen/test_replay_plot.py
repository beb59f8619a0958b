"""The figure of `kvemu replay --plot` and `kvemu demo` on a small real replay (router and two
replicas on loopback), read back through matplotlib's objects."""

from __future__ import annotations

import argparse
import asyncio

import pytest
from matplotlib.colors import to_hex

from kvemu.replay_cmd import cluster_report, plot_context
from kvemu.up import add_cluster_args, bring_up, validate
from loadgen.plots import replay_figure
from loadgen.replay import Replayer, sessions_of, summarize
from loadgen.workloads import generate
from shared.plotting import PALETTE, REPLICA_BAR, REPLICA_LINE, duration_text, pyplot
from tests.support.plots import ceiling_of, check_readable, legend_labels

# A router and two replicas on loopback, about 20 s: an end-to-end test (CI runs it, and hands its file
# out first; `-m "not slow"` skips it locally).
pytestmark = pytest.mark.slow

SPEEDUP = 20.0
MAX_REQUESTS = 120


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    p = argparse.ArgumentParser()
    add_cluster_args(p, replicas=2)
    args = p.parse_args(["--capacity-blocks", "8192", "--time-scale", str(1 / SPEEDUP)])
    args.port = 0
    cluster = bring_up(validate(args), log_dir=str(tmp_path_factory.mktemp("cluster-logs")))
    try:
        trace = generate("mix", 120, seed=5)
        records = asyncio.run(Replayer(cluster.router_url, trace, SPEEDUP, MAX_REQUESTS, progress=False).run())
        report = cluster_report(cluster.router_url, {})
    finally:
        cluster.stop()
    sent = [r for reqs in sessions_of(trace, MAX_REQUESTS).values() for r in reqs]
    return summarize(records, trace.block_size), records, plot_context(trace, sent, SPEEDUP, report), sent


def test_replay_figure(replayed, tmp_path):
    summary, records, ctx, sent = replayed
    assert summary["ok"] == MAX_REQUESTS
    span = max(r.t for r in sent) - min(r.t for r in sent)
    fig = replay_figure(summary, records, ctx)
    try:
        check_readable(fig)
        assert fig._suptitle.get_text() == (f"mix preset, {span:.0f} s of trace replayed 20x faster: 2 replicas x 8,192 "
                                            "blocks, lru, cache_aware routing, qwen3-coder-30b-a3b on h200")
        per, twin, over, ttft = (fig.axes[0], fig.axes[3], fig.axes[1], fig.axes[2])
        assert per.get_title() == "per replica: requests routed and block hit ratio"
        assert (per.get_xlabel(), per.get_ylabel(), twin.get_ylabel()) == ("replica", "requests routed",
                                                                         "block hit ratio")
        c = ctx["ceiling"]
        assert 0 < c < 1
        assert legend_labels(per) == ["requests routed (bars, left axis)", "block hit ratio (line, right axis)",
                                      f"infinite cache, whole replay: {c:.3f}"]
        assert ceiling_of(twin) == pytest.approx(c) and ceiling_of(over) == pytest.approx(c)
        assert over.get_title() == "cluster block hit ratio over the replay"
        assert (over.get_xlabel(), over.get_ylabel()) == ("wall time since the replay started (s)",
                                                          "block hit ratio (all replicas)")
        labels = legend_labels(over)
        assert labels[0].startswith("per ") and labels[0].endswith(" s window")
        assert labels[1:] == ["since the start", f"infinite cache, whole replay: {c:.3f}"]
        assert ttft.get_title() == "emulated time to first token (CDF)"
        assert (ttft.get_xlabel(), ttft.get_ylabel()) == ("TTFT (emulated; log scale when all are above 0)",
                                                          "fraction of requests with TTFT ≤ x")
        fig.canvas.draw()  # the x axis reads as durations, and no minor label crowds them
        shown = [t.get_text() for t in ttft.get_xticklabels() if t.get_visible() and t.get_text()]
        assert shown and all(text.endswith((" ms", " s")) for text in shown), shown
        assert not any(t.get_text() for t in ttft.get_xticklabels(minor=True))
        assert legend_labels(ttft) == ["all requests", f"p50 = {duration_text(summary['ttft_p50_s'])}",
                                       f"p99 = {duration_text(summary['ttft_p99_s'])}"]
        assert [t.get_text() for t in per.get_xticklabels()] == ["r0", "r1"]
        assert to_hex(per.patches[0].get_facecolor()) == REPLICA_BAR.lower()
        assert to_hex(twin.get_lines()[0].get_color()) == REPLICA_LINE
        assert not {REPLICA_BAR.lower(), REPLICA_LINE} & set(PALETTE)
        fig.savefig(tmp_path / "replay.png")
    finally:
        pyplot().close(fig)
