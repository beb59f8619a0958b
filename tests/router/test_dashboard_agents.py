"""The dashboard's agent panel in headless Chromium: the `agent` preset replayed through the router with its
fan-outs made frequent, so sessions with several requests in flight at once (parallel tool calls, subagents, each
under the parent's session id) show on the chart and in the table, as the router counts them."""

from __future__ import annotations

import subprocess

import pytest

from tests.router.test_dashboard import (  # noqa: F401 - chromium is a fixture
    DRAWN_PIXELS_JS,
    _open,
    chromium,
    screenshot_panels,
)
from tests.support.cluster import start_router, stop_all
from tests.support.kvemu_cli import REPO, kvemu_cmd
from tests.support.procs import http_json, start_replica

pytestmark = pytest.mark.slow


def test_agent_panel_in_headless_chromium(chromium, tmp_path):  # noqa: F811 - the imported fixture
    reps = [start_replica(capacity_blocks=3000, time_scale=0.2, replica_id=f"agent-{i}") for i in range(2)]
    router = replay = None
    try:
        router = start_router([r.url for r in reps], "--dashboard-interval", "0.25")
        replay = subprocess.Popen(kvemu_cmd("replay", "--url", router.url, "--workload", "agent", "--duration", "600",
                                            "--set", "tool_fanout_prob=0.8", "--set", "subagent_prob=0.2",
                                            "--set", "max_context=16000",
                                            "--speedup", "20", "--seed", "5", "--quiet"),
                                  cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        page, problems = _open(chromium, router.url, 1280, 900)
        # a fan-out seen: a sample with a session of more than one request in flight, and the table listing sessions
        # (the replicas' emulated time a fifth of the wall's: requests last long enough for children to overlap)
        page.wait_for_function("() => { const c = window.kvemuDashboard.charts.agent_sessions;"
                               " return c && c.plot.data[2].some((v) => v > 0) && c.plot.data[3].some((v) => v > 1)"
                               " && document.querySelectorAll('#agent_sessions tbody tr').length > 0; }",
                               timeout=60_000)
        page.evaluate(f"() => {{ window.drawnPixels = {DRAWN_PIXELS_JS}; }}")
        page.wait_for_function("() => window.drawnPixels('agent_sessions') > 20", timeout=20_000)
        _, view = http_json("GET", router.url + "/dashboard/data?points=600")
        h = view["history"]["cluster"]
        assert max(h["widest_fanout"]) > 1 and max(h["sessions_fanned_out"]) >= 1
        assert all(f <= s for f, s in zip(h["sessions_fanned_out"], h["sessions_in_flight"]))
        rows = view["agent_sessions"]["top"]
        assert all(r["session"].startswith("s-") for r in rows)  # keyed hashes on the public page
        assert [r["in_flight"] for r in rows] == sorted((r["in_flight"] for r in rows), reverse=True)
        shots = screenshot_panels(page, tmp_path, {"agent_sessions": "dashboard-agent-sessions.png"})
        assert (shots / "dashboard-agent-sessions.png").stat().st_size > 10_000
        assert problems == [], problems
    finally:
        if replay is not None:
            replay.terminate()
            replay.wait(10)
        stop_all(router, *reps)
