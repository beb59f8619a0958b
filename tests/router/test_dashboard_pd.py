"""The dashboard of a disaggregated cluster in headless Chromium: a panel per pool and one for the transfer
link, drawn from the replicas' /stats ``pd`` section while `kvemu replay` sends load through the router."""

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


def test_pd_panels_in_headless_chromium(chromium, tmp_path):  # noqa: F811 - the imported fixture
    reps = [start_replica("--role", "prefill", capacity_blocks=1500, time_scale=0.05, replica_id="prefill-0"),
            start_replica("--role", "decode", capacity_blocks=1500, time_scale=0.05, replica_id="decode-0"),
            start_replica("--role", "decode", capacity_blocks=1500, time_scale=0.05, replica_id="decode-1")]
    router = replay = None
    try:
        router = start_router([f"prefill={reps[0].url}", f"decode={reps[1].url}", f"decode={reps[2].url}"],
                              "--dashboard-interval", "0.5", "--pd-decider", "always")
        replay = subprocess.Popen(kvemu_cmd("replay", "--url", router.url, "--workload", "chat", "--duration", "600",
                                            "--speedup", "10", "--seed", "3", "--quiet"),
                                  cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        page, problems = _open(chromium, router.url, 1280, 900)
        page.wait_for_selector("[data-panel=pd_pools]:not([hidden])", timeout=20_000)
        page.wait_for_function("() => Number(document.querySelector('[data-panel=pd_link]').dataset.points || 0) > 0"
                               " && document.querySelectorAll('#pd_link tbody tr').length === 3", timeout=60_000)
        page.wait_for_function("() => { const r = document.querySelector(\"#pd_link tr[data-replica='prefill-0']\");"
                               " return r && r.children[3].textContent !== '0'; }", timeout=30_000)
        page.evaluate(f"() => {{ window.drawnPixels = {DRAWN_PIXELS_JS}; }}")
        page.wait_for_function("() => window.drawnPixels('pd_link') > 20", timeout=20_000)
        pools = page.inner_text("#pd_pools tbody")
        assert "prefill\tprefill-0\t1 / 1" in pools and "decode\tdecode-0, decode-1\t2 / 2" in pools, pools
        assert "remote" in page.inner_text("#pd-paths") and page.inner_text("#pd-decider") == "always"
        prefill_row = page.inner_text("#pd_link tr[data-replica='prefill-0']")
        assert prefill_row.split("\t")[1] == "prefill" and prefill_row.split("\t")[3] != "0", prefill_row
        _, view = http_json("GET", router.url + "/dashboard/data?points=5")
        assert view["pd"]["pools"]["decode"] == ["decode-0", "decode-1"] and view["pd"]["paths"]["remote"] > 0
        assert view["pd"]["link"]["prefill-0"]["send"]["transfers"] > 0
        shots = screenshot_panels(page, tmp_path, {"pd_pools": "dashboard-pd-pools.png",
                                                   "pd_link": "dashboard-pd-link.png"})
        assert (shots / "dashboard-pd-link.png").stat().st_size > 10_000
        assert problems == [], problems
    finally:
        if replay is not None:
            replay.terminate()
            replay.wait(10)
        stop_all(router, *reps)
