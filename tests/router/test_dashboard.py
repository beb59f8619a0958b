"""The router's /dashboard in a real headless Chromium (Debian's, driven by Playwright) against
real replica processes and a real replay: every panel draws data, the page updates, a killed
replica shows as down, a live policy switch brings its panel up, and the console stays clean."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.cluster import start_router, stop_all, wait_for
from tests.support.kvemu_cli import REPO, kvemu_cmd
from tests.support.procs import http, http_json, start_replica

CHART_PANELS = ("kv_usage", "hit_ratio", "csr", "running", "waiting", "ttft", "evictions", "mrc", "reuse",
                "decisions", "imbalance", "hotspots", "index_lag", "index_size")
TABLE_PANELS = ("replicas", "top_sessions")

# Pixels of a chart's canvas within a small distance of one of its series' colours: drawn lines,
# not axes or grid (those are grey or black, and black is no series colour in these charts).
DRAWN_PIXELS_JS = """name => {
  const c = window.kvemuDashboard.charts[name];
  const want = c.colors.map(h => [1, 3, 5].map(i => parseInt(h.slice(i, i + 2), 16)));
  const cv = c.plot.ctx.canvas;
  const px = c.plot.ctx.getImageData(0, 0, cv.width, cv.height).data;
  let n = 0;
  for (let i = 0; i < px.length; i += 4) {
    if (px[i + 3] < 200) continue;
    if (want.some(([r, g, b]) => Math.abs(px[i] - r) + Math.abs(px[i + 1] - g) + Math.abs(px[i + 2] - b) < 60)) n++;
  }
  return n;
}"""


@pytest.mark.parametrize("index", ["memory", "redis"])
def test_dashboard_data_and_pages_over_http(index, redis_server):
    cluster = "dash" + uuid.uuid4().hex[:8]
    rep_args = ("--index", redis_server.url, "--cluster", cluster) if index == "redis" else ()
    rep = start_replica(*rep_args, capacity_blocks=500, replica_id="d0")
    router = None
    try:
        router = start_router([rep.url], "--dashboard-interval", "0.2",
                              *(("--cluster", cluster) if index == "redis" else ()),
                              index=redis_server.url if index == "redis" else "memory")
        status, _, page = http("GET", router.url + "/")
        assert status == 200 and b'href="/dashboard"' in page
        status, headers, page = http("GET", router.url + "/dashboard")
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        assert b"/static/vendor/uPlot.iife.min.js" in page and b"/static/dashboard.js" in page
        for path in ("/static/vendor/uPlot.iife.min.js", "/static/dashboard.js", "/static/dashboard.css"):
            assert http("GET", router.url + path)[0] == 200, path
        assert http("GET", router.url + "/static/../dashboard.py")[0] == 404
        for bad in ("0", "601", "x", "-1"):
            status, body = http_json("GET", router.url + "/dashboard/data?points=" + bad)
            assert status == 400 and body["error"]["param"] == "points", (bad, body)

        status, _, _ = http("POST", router.url + "/generate", {"token_ids": list(range(160)), "max_tokens": 1})
        assert status == 200  # 10 full blocks, now in the index

        def indexed():
            view = http_json("GET", router.url + "/dashboard/data")[1]
            return view if view["index"].get("entries") == 10 and len(view["history"]["t"]) >= 3 else None

        wait_for(indexed, timeout=10.0, what="10 index entries and 3 samples on the dashboard")
        status, view = http_json("GET", router.url + "/dashboard/data?points=2")
        assert status == 200 and len(view["history"]["t"]) == 2
        assert view["index"]["backend"] == index
        assert list(view["history"]["replicas"]) == ["d0"]
        row = view["replicas"][0]
        assert (row["replica_id"], row["healthy"]) == ("d0", True)
        st = row["stats"]
        assert (st["policy"], st["capacity_blocks"], st["requests"]) == ("lru", 500, 1)
        assert st["top_sessions"] == [{"session": None, "blocks": 10}]
        assert st["ttft"]["requests"] == 1 and st["ttft"]["p50_s"] == st["ttft"]["p99_s"] > 0
        assert view["decisions"] == {"cache_miss_balance": 1.0}  # an empty index: nothing cached to follow
    finally:
        stop_all(router, rep)


@pytest.fixture(scope="module")
def chromium():
    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail("chromium is not installed; run scripts/test, which installs it from the OS packages")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        yield browser
        browser.close()


def _open(browser, url: str, width: int, height: int):
    page = browser.new_page(viewport={"width": width, "height": height})
    problems: list[str] = []
    # Errors and warnings, except the one our own pixel readback (DRAWN_PIXELS_JS) causes.
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
            if m.type in ("error", "warning") and "willReadFrequently" not in m.text else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.goto(url + "/dashboard")
    return page, problems


def screenshot_panels(page, tmp_path, names: dict[str, str]) -> Path:
    """Each ``data-panel`` of ``names`` as its PNG in $KVEMU_SCREENSHOTS (where the docs' images are
    made) or else the test's folder; that folder."""
    shots = Path(os.environ.get("KVEMU_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    for panel, name in names.items():
        page.locator(f"[data-panel={panel}]").screenshot(path=str(shots / name))
    return shots


def _points(page) -> dict:
    return page.eval_on_selector_all("[data-panel]", "els => Object.fromEntries(els.map(e => "
                                     "[e.dataset.panel, Number(e.dataset.points || 0)]))")


@pytest.mark.slow
def test_dashboard_in_headless_chromium(chromium, tmp_path):
    ids = ("dash-a", "dash-b", "dash-c")
    reps = [start_replica(capacity_blocks=600, time_scale=0.05, replica_id=rid) for rid in ids]
    router = replay = None
    try:
        router = start_router([r.url for r in reps], "--dashboard-interval", "0.5")
        replay = subprocess.Popen(kvemu_cmd("replay", "--url", router.url, "--workload", "mix", "--duration", "600",
                                            "--speedup", "10", "--seed", "3", "--quiet"),
                                  cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        page, problems = _open(chromium, router.url, 1280, 800)
        assert page.locator("[data-panel=policy_switches]").is_hidden()  # no switch yet, no panel

        # Every panel draws data: values on every chart, rows in every table.
        want = CHART_PANELS + TABLE_PANELS
        page.wait_for_function(f"() => {json.dumps(want)}.every(n => Number(document.querySelector("
                               f"`[data-panel=${{n}}]`).dataset.points || 0) > 0)", timeout=60_000)
        assert page.locator("#replicas tbody tr").count() == 3
        # ... and those values are drawn: series-coloured pixels on every chart's canvas.
        page.evaluate(f"() => {{ window.drawnPixels = {DRAWN_PIXELS_JS}; }}")
        try:
            page.wait_for_function(f"() => {json.dumps(CHART_PANELS)}.every(n => window.drawnPixels(n) > 20)",
                                   timeout=20_000)
        except Exception:
            drawn = {n: page.evaluate("n => window.drawnPixels(n)", n) for n in CHART_PANELS}
            raise AssertionError(f"a chart has values but nothing drawn: {drawn}") from None
        assert "3 of 3 replicas up, cache_aware routing, memory index" in page.inner_text("#summary")

        # It updates: more samples, more values drawn, a later time.
        before = (int(page.get_attribute("#updated", "data-samples")), _points(page)["kv_usage"],
                  float(page.get_attribute("#updated", "data-now")))
        page.wait_for_timeout(2500)
        after = (int(page.get_attribute("#updated", "data-samples")), _points(page)["kv_usage"],
                 float(page.get_attribute("#updated", "data-now")))
        assert all(a > b for a, b in zip(after, before)), (before, after)

        # A live policy switch brings up its panel.
        status, _ = http_json("POST", reps[0].url + "/admin/policy", {"policy": "s3fifo"},
                              headers={"Authorization": "Bearer secret"})
        assert status == 200
        page.wait_for_selector("[data-panel=policy_switches]:not([hidden])", timeout=10_000)
        assert page.inner_text("#policy_switches tbody").split()[-3:] == ["dash-a", "lru", "s3fifo"]
        page.screenshot(path=str(tmp_path / "dashboard-1280x800.png"), full_page=True)

        # A killed replica shows as down; the others stay up.
        reps[1].stop(signal.SIGKILL)
        page.wait_for_function("() => document.querySelector('tr[data-replica=\"dash-b\"] .status')"
                               ".textContent === 'down'", timeout=15_000)
        assert page.inner_text("tr[data-replica='dash-a'] .status") == "up"
        assert "2 of 3 replicas up" in page.inner_text("#summary")
        page.screenshot(path=str(tmp_path / "dashboard-replica-down.png"), full_page=True)

        # Readable on a phone: one column, nothing wider than the screen but the scrolling tables.
        phone, phone_problems = _open(chromium, router.url, 390, 844)
        phone.wait_for_function("() => Number(document.querySelector('[data-panel=mrc]').dataset.points) > 0")
        assert phone.evaluate("document.documentElement.scrollWidth") <= 390
        phone.screenshot(path=str(tmp_path / "dashboard-phone.png"), full_page=True)
        assert problems == [] and phone_problems == [], problems + phone_problems
        for name in ("dashboard-1280x800.png", "dashboard-replica-down.png", "dashboard-phone.png"):
            assert (tmp_path / name).stat().st_size > 20_000
    finally:
        if replay is not None:
            replay.terminate()
            replay.wait(10)
        stop_all(router, *reps)
