"""The router's live dashboard: ``GET /dashboard`` (a static page from ``router/static``) and
``GET /dashboard/data`` (what the page polls every second).

A sampler task reads every healthy replica's ``/stats`` once per ``dashboard_interval_s``
and keeps the last ``HISTORY`` samples, so a page opened late still shows the recent past.
Rates (evictions/s, decisions/s) and the hit ratio and CSR over time are differences of
cumulative counters over the last ``RATE_WINDOW_S`` seconds; a replica that restarted (its
counters went down) gets no value for that window rather than a negative one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from pathlib import Path

import aiohttp
from aiohttp import web

from router.state import ROUTER
from router.views import cluster_summary, refresh_store_stats
from shared.auth import session_label, wants_raw_sessions
from shared.errors import InputError
from shared.index import MemoryIndex

log = logging.getLogger("kvemu.router.dashboard")
STATIC = Path(__file__).with_name("static")
HISTORY = 600  # samples kept (10 minutes at the default 1 s)
TOP_SESSIONS = 5
RATE_WINDOW_S = 5.0  # rates, hit ratio and CSR over time are taken over this window
COUNTERS = ("requests", "block_accesses", "block_hits", "recompute_cost_total_s", "recompute_cost_saved_s",
            "evictions")
# per-replica series drawn over time, each a value per sample (None: no value that interval)
REPLICA_SERIES = ("kv_usage", "hit_ratio", "csr", "running", "waiting", "ttft_p50_s", "ttft_p99_s",
                  "evictions_per_s", "event_lag", "link_bytes_per_s")
CLUSTER_SERIES = ("imbalance_in_flight", "imbalance_kv_usage", "imbalance_routed", "index_entries", "hotspots",
                  "sessions_in_flight", "sessions_fanned_out", "widest_fanout")
TOP_FLIGHTS = 8  # the sessions in flight the agent panel lists
# per shared KV store (--shared-store), over time: its occupancy, the bytes it holds, its aggregate link's bytes/s
STORE_SERIES = ("occupancy", "used_bytes", "link_bytes_per_s", "evictions_per_s")


class Dashboard:
    """Samples of the cluster over time, and the latest detail (MRC, reuse histogram, top sessions)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.samples: deque[dict] = deque(maxlen=HISTORY)
        self.latest: dict[str, dict] = {}  # replica_id -> its last /stats

    async def loop(self, state) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.sample(state)
            except Exception:  # noqa: BLE001 - a bad sample must not stop the page for good
                log.warning("dashboard sample failed", exc_info=True)
            await asyncio.sleep(max(self.interval_s - (time.monotonic() - started), 0.05))

    def _baseline(self, now: float) -> dict | None:
        """The oldest sample of the last ``RATE_WINDOW_S``: rates and ratios are taken since then."""
        for old in self.samples:
            if old["t"] >= now - RATE_WINDOW_S - 1e-3:
                return old
        return None

    async def sample(self, state) -> dict:
        stats = await _fetch_stats(state)
        stores = state.cluster.stores
        await asyncio.gather(*(refresh_store_stats(state, p) for p in stores if p.healthy))
        for rep in state.cluster.replicas:  # the P/D link and the levels as /cluster shows them, from this sample
            if rep.replica_id in stats:
                rep.pd_stats = stats[rep.replica_id].get("pd") or {}
                rep.tier_stats = stats[rep.replica_id].get("tiers") or {}
        now = time.time()
        base = self._baseline(now)
        summary = cluster_summary(state)
        known = {r.replica_id for r in state.cluster.replicas if r.known}  # before /health, ids are URLs
        replicas, counters = {}, {}
        for row in summary["replicas"]:
            replica_id = row["replica_id"]
            if replica_id not in known:
                continue
            st = stats.get(replica_id)
            if st is not None:
                self.latest[replica_id] = st
                counters[replica_id] = {k: st.get(k, 0) for k in COUNTERS}
                counters[replica_id]["link_bytes"] = _link_bytes(st)
            prev = base["counters"].get(replica_id) if base else None
            replicas[replica_id] = _replica_point(row, st, counters.get(replica_id), prev,
                                                  now - base["t"] if base else 0.0)
        decisions = state.metrics.totals().decisions  # the whole router's, under --workers
        dt = now - base["t"] if base else 0.0
        was = base["decisions"] if base else {}
        rates = {reason: (n - was.get(reason, 0.0)) / dt if dt else None for reason, n in decisions.items()}
        index = state.index.stats_sync() if isinstance(state.index, MemoryIndex) else await _redis_stats(state)
        imb = summary["imbalance"]
        flights = state.sessions.now(0)  # the router's own sessions in flight (router/session_flights.py)
        point = {"t": now, "replicas": replicas, "counters": counters, "decisions_per_s": rates,
                 "decisions": decisions,
                 "cluster": {"imbalance_in_flight": imb["in_flight"], "imbalance_kv_usage": imb["kv_usage"],
                             "imbalance_routed": imb["routed"], "index_entries": index.get("entries"),
                             "hotspots": len(summary["hotspots"]), "sessions_in_flight": flights.sessions,
                             "sessions_fanned_out": flights.fanned_out, "widest_fanout": flights.widest},
                 "summary": summary, "index": index,
                 "stores": {p.name: _store_point(p, base["stores"].get(p.name) if base else None,
                                                 now - base["t"] if base else 0.0) for p in stores}}
        self.samples.append(point)
        return point

    def view(self, state, points: int, raw_sessions: bool = False) -> dict:
        """The last ``points`` samples and the latest detail; session ids as keyed hashes (as /cluster shows
        them) unless ``raw_sessions`` (asked with the cluster token)."""
        samples = list(self.samples)[-points:]
        last = samples[-1] if samples else None
        replica_ids = list(dict.fromkeys(replica_id for s in samples for replica_id in s["replicas"]))
        reasons = sorted({r for s in samples for r in s["decisions_per_s"]})
        hist = {"t": [round(s["t"], 2) for s in samples],
                "replicas": {replica_id: {k: _series(s["replicas"].get(replica_id, {}).get(k) for s in samples)
                                          for k in REPLICA_SERIES} for replica_id in replica_ids},
                "cluster": {k: _series(s["cluster"][k] for s in samples) for k in CLUSTER_SERIES},
                "decisions_per_s": {r: _series(s["decisions_per_s"].get(r) for s in samples) for r in reasons}}
        store_ids = list(dict.fromkeys(sid for s in samples for sid in s["stores"]))
        hist["stores"] = {sid: {k: _series(s["stores"].get(sid, {}).get(k) for s in samples) for k in STORE_SERIES}
                          for sid in store_ids}
        rows = []
        token = state.settings.serving.cluster_token
        label = (lambda s: s) if raw_sessions or not token else (lambda s: session_label(s, token))
        for row in (last["summary"]["replicas"] if last else []):
            rows.append({**row, **_detail(self.latest.get(row["replica_id"]), label)})
        return {"now": time.time(), "interval_s": self.interval_s, "routing": state.settings.routing,
                "index": last["index"] if last else {}, "decisions": last["decisions"] if last else {},
                "hotspots": last["summary"]["hotspots"] if last else [],
                "hotspot_factor": state.settings.hotspot_factor, "replicas": rows, "history": hist,
                "pd": last["summary"].get("pd") if last else None,
                "shared_stores": last["summary"].get("shared_stores", []) if last else [],
                "agent_sessions": _flights(state.sessions.now(TOP_FLIGHTS, label))}


def _flights(now) -> dict:
    """The sessions in flight now, as the agent panel shows them (each top session's time in flight in seconds)."""
    t = time.time()
    return {"sessions": now.sessions, "fanned_out": now.fanned_out, "requests": now.requests, "widest": now.widest,
            "top": [{"session": f.session, "in_flight": f.in_flight, "widest": f.widest,
                     "for_s": round(t - f.since, 1)} for f in now.top]}


def _series(values) -> list:
    """Four significant digits are all a 200-pixel chart can show; the JSON is a third the size."""
    return [float(f"{v:.4g}") if isinstance(v, float) else v for v in values]


def _replica_point(row: dict, st: dict | None, cur: dict | None, prev: dict | None, dt: float) -> dict:
    point = {"kv_usage": row["kv_usage"] if row["healthy"] else None, "running": None, "waiting": None,
             "event_lag": row["event_lag"] if row["healthy"] else None}
    if st is None or not row["healthy"]:
        return point
    point["kv_usage"] = st.get("usage", row["kv_usage"])
    sched = st.get("scheduler", {})
    point["running"], point["waiting"] = sched.get("running"), sched.get("waiting")
    ttft = st.get("ttft", {})
    point["ttft_p50_s"], point["ttft_p99_s"] = ttft.get("p50_s"), ttft.get("p99_s")
    if prev is not None and cur is not None and dt > 0 and cur["requests"] >= prev["requests"]:
        d = {k: cur[k] - prev[k] for k in COUNTERS}
        acc, cost = d["block_accesses"], d["recompute_cost_total_s"]
        point["hit_ratio"] = d["block_hits"] / acc if acc > 0 else None
        point["csr"] = d["recompute_cost_saved_s"] / cost if cost > 0 else None
        point["evictions_per_s"] = max(d["evictions"], 0) / dt
        if "link_bytes" in cur and "link_bytes" in prev and st.get("pd", {}).get("role", "both") != "both":
            point["link_bytes_per_s"] = max(cur["link_bytes"] - prev["link_bytes"], 0) / dt
    return point


def _store_point(store, prev: dict | None, dt: float) -> dict:
    """A shared store's sample: occupancy and bytes held now, its link's bytes/s and evictions/s since ``prev``
    (cumulative counters; a store that restarted, its counters down, gets no rate that interval)."""
    st = store.stats if store.healthy else {}
    blocks, used = st.get("blocks"), st.get("used_blocks")
    point = {"occupancy": used / blocks if blocks and used is not None else None, "used_bytes": st.get("used_bytes"),
             "bytes_moved": st.get("bytes_moved"), "evictions": st.get("evictions"), "link_bytes_per_s": None,
             "evictions_per_s": None}
    if prev is not None and dt > 0:
        for total, rate in (("bytes_moved", "link_bytes_per_s"), ("evictions", "evictions_per_s")):
            now_v, was = point[total], prev.get(total)
            if isinstance(now_v, int | float) and isinstance(was, int | float) and now_v >= was:
                point[rate] = (now_v - was) / dt
    return point


def _link_bytes(st: dict) -> float:
    """Bytes a P/D replica's NIC moved, both directions (its /stats ``pd`` section)."""
    pd = st.get("pd") or {}
    return float(sum((pd.get(side) or {}).get("bytes", 0) for side in ("send", "recv")))


def _detail(st: dict | None, label) -> dict:
    """What the page shows of a replica's last /stats besides the series (its top sessions' ids as
    ``label`` shows them)."""
    if st is None:
        return {"stats": None}
    reuse = st.get("reuse") or {}
    mrc = [p for p in reuse.get("mrc", []) if p[0] >= 1]
    top = [{**row, "session": label(row.get("session"))} for row in st.get("top_sessions", [])]
    return {"stats": {
        "policy": st.get("policy", {}).get("name"), "capacity_blocks": st.get("capacity_blocks"),
        "capacity_gib": st.get("capacity_gib"), "model": st.get("model"), "gpu": st.get("gpu"),
        "block_hit_ratio": st.get("block_hit_ratio"), "csr": st.get("csr"), "requests": st.get("requests"),
        "evictions": st.get("evictions"), "ttft": st.get("ttft"), "top_sessions": top,
        "mrc": mrc, "reuse_distance_log2": reuse.get("distance_log2", {}), "reuse_accesses": reuse.get("accesses"),
        "policy_switches": st.get("policy_switches", []), "pd": st.get("pd"),
    }}




async def _fetch_stats(state) -> dict[str, dict]:
    # the sessions as sent where the router holds the token (the page hashes them, but where asked with it)
    raw = "&sessions=raw" if state.settings.serving.cluster_token else ""

    async def one(rep):
        try:
            async with state.cluster.session.get(f"{rep.url}/stats?top={TOP_SESSIONS}{raw}", headers=state.cluster.auth,
                                                 timeout=aiohttp.ClientTimeout(total=1.0)) as resp:
                if resp.status == 200:
                    return rep.replica_id, await resp.json()
        except (TimeoutError, aiohttp.ClientError, ValueError):
            pass
        return rep.replica_id, None

    got = await asyncio.gather(*(one(r) for r in state.cluster.replicas if r.state.healthy))
    return {replica_id: st for replica_id, st in got if st is not None}


async def _redis_stats(state) -> dict:
    try:
        return await asyncio.wait_for(state.index.stats(), 1.0)
    except Exception:  # noqa: BLE001 - an unreachable index shows as such, the page keeps going
        return {"backend": "redis", "error": "index unavailable"}


# ---- handlers ----------------------------------------------------------------------------
DASHBOARD = web.AppKey("dashboard", Dashboard)


FIRST_DATA = '<script id="first-data" type="application/json">null</script>'


async def page(request: web.Request) -> web.Response:
    """The page with the data of this moment inlined (what /dashboard/data would answer, session ids hashed),
    which it draws before its load event: a first screenshot, or a first look, need not wait for a poll."""
    first = json.dumps(request.app[DASHBOARD].view(request.app[ROUTER], HISTORY)).replace("<", "\\u003c")
    html = (STATIC / "dashboard.html").read_text().replace(FIRST_DATA, FIRST_DATA.replace("null", first), 1)
    resp = web.Response(text=html, content_type="text/html", headers={"Cache-Control": "no-cache"})
    resp.enable_compression()
    return resp


async def data(request: web.Request) -> web.Response:
    raw = request.query.get("points", str(HISTORY))
    if not raw.isdigit() or not 1 <= int(raw) <= HISTORY:
        raise InputError("points", f"expected an integer between 1 and {HISTORY}, got {raw!r:.40}")
    state = request.app[ROUTER]
    view = request.app[DASHBOARD].view(state, int(raw), wants_raw_sessions(request, state.settings.serving.cluster_token))
    resp = web.json_response(view, headers={"Cache-Control": "no-store"})
    resp.enable_compression()  # gzip when the browser accepts it: the history is repetitive numbers
    return resp


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


def add_routes(app: web.Application) -> None:
    app.router.add_get("/", index)
    app.router.add_get("/dashboard", page)
    app.router.add_get("/dashboard/data", data)
    app.router.add_static("/static/", STATIC, append_version=False)
