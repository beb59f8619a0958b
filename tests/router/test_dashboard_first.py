"""The dashboard's first look: the page comes with the data of its moment and draws it before its load
event (a headless screenshot taken at load is not empty), and its top sessions' ids, hashed as /cluster
shows them, are shown as sent with the cluster token (?sessions=raw#token=T)."""

from __future__ import annotations

import json
import re

import pytest

from shared.auth import session_label
from shared.runtime_dir import cluster_token_path, read_token_file
from tests.router.test_dashboard import DRAWN_PIXELS_JS, chromium  # noqa: F401 - chromium is a fixture
from tests.support.cluster import start_router, stop_all, wait_for
from tests.support.procs import http, http_json, start_replica

FIRST = re.compile(rb'<script id="first-data" type="application/json">(.*?)</script>', re.S)


def _sessions(page) -> list[str]:
    return page.eval_on_selector_all("#top_sessions tbody tr", "rows => rows.map(r => r.cells[1].textContent)")


@pytest.mark.slow  # real processes and a browser: about 6 s
def test_the_page_draws_its_first_data_before_load_and_raw_sessions_with_the_token(chromium, tmp_path):  # noqa: F811
    rep = start_replica(capacity_blocks=500, replica_id="first-0")
    router = None
    try:
        router = start_router([rep.url], "--dashboard-interval", "0.2")
        status, _, _ = http("POST", router.url + "/generate", {"token_ids": list(range(160)), "max_tokens": 1},
                            headers={"X-Session-Id": "alice"})
        assert status == 200
        wait_for(lambda: len(http_json("GET", router.url + "/dashboard/data")[1]["history"]["t"]) >= 3,
                 what="three samples on the dashboard")
        token = read_token_file(cluster_token_path())
        hashed = session_label("alice", token)

        # the page carries the data (what /dashboard/data answers, ids hashed); raw ids only with the token
        status, headers, html = http("GET", router.url + "/dashboard")
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        first = json.loads(FIRST.search(html).group(1))
        assert first["replicas"][0]["stats"]["top_sessions"] == [{"session": hashed, "blocks": 10}]
        assert http("GET", router.url + "/dashboard/data?sessions=raw")[0] == 401
        status, view = http_json("GET", router.url + "/dashboard/data?sessions=raw",
                                 headers={"Authorization": f"Bearer {token}"})
        assert status == 200 and view["replicas"][0]["stats"]["top_sessions"] == [{"session": "alice", "blocks": 10}]

        # at the load event, with no poll answered (the page's polls refused here): the header, the table
        # and a drawn chart, from the data the page came with
        page = chromium.new_page(viewport={"width": 1280, "height": 800})
        page.route("**/dashboard/data*", lambda route: route.abort())
        page.goto(router.url + "/dashboard", wait_until="load")
        at_load = page.evaluate(f"""() => ({{samples: Number(document.getElementById("updated").dataset.samples),
            rows: document.querySelectorAll("#replicas tbody tr").length,
            pixels: ({DRAWN_PIXELS_JS})("kv_usage")}})""")
        assert at_load["samples"] >= 3 and at_load["rows"] == 1 and at_load["pixels"] > 20, at_load
        assert _sessions(page) == [hashed]
        page.screenshot(path=str(tmp_path / "at-load.png"))
        page.unroute("**/dashboard/data*")

        # the ids as sent with the cluster token, which leaves the address bar; a wrong one says why
        page.goto(f"{router.url}/dashboard?sessions=raw#token={token}")
        page.wait_for_function("() => document.querySelector('#top_sessions tbody tr')")
        assert _sessions(page) == ["alice"] and page.evaluate("location.hash") == ""
        assert page.inner_text("#sessions-note") == "Session ids as sent (asked with the cluster token)."
        page = chromium.new_page()  # a tab of its own: the token is kept per tab
        page.goto(f"{router.url}/dashboard?sessions=raw#token=wrong")
        page.wait_for_function("() => document.querySelector('#top_sessions tbody tr')")
        assert _sessions(page) == [hashed]
        assert page.inner_text("#sessions-note").startswith("Raw session ids refused (401): open"
                                                            " /dashboard?sessions=raw#token=TOKEN")
    finally:
        stop_all(router, rep)
