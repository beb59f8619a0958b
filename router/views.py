"""Router handlers: proxy to the chosen replica (streaming passed through), /cluster, /metrics."""

from __future__ import annotations

import asyncio
import math
import os

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from router import pd_legs
from router.metrics import merge_vllm, replica_metrics_texts
from router.request_path import Pool, RequestContext, Target, answer_from, exchange, lookup, record_prediction, relay
from router.state import ROUTER, RouterState
from shared import protocol
from shared.auth import session_label, wants_raw_sessions
from shared.hashing import reusable_prefix_tokens
from shared.http_server import until_client_gone
from shared.httpkit import read_raw, respond
from shared.offload import OFFLOAD


def _state(request: web.Request) -> RouterState:
    return request.app[ROUTER]


async def proxy(request: web.Request) -> web.StreamResponse:
    state = _state(request)
    limiter = state.limiter
    if limiter is None:
        return await _route(request, state)
    client = request.remote or "?"
    refusal = limiter.admit(client)
    if refusal is not None:
        state.metrics.outcome(refusal.field)  # kvemu_router_requests_total{outcome="client_rate"}
        retry = str(max(1, math.ceil(refusal.retry_after_s)))
        return web.json_response(protocol.error_body(429, refusal.field, refusal.message), status=429,
                                 headers={"Retry-After": retry})
    try:
        return await _route(request, state)
    finally:
        limiter.release(client)


async def _route(request: web.Request, state: RouterState) -> web.StreamResponse:
    raw = await read_raw(request)
    limits = (state.settings.serving.max_prompt_tokens, state.settings.serving.max_output_tokens)
    spec = await request.app[OFFLOAD].parse(request, raw, state.settings.block_size, limits)
    ctx = RequestContext.of(request, raw, spec)
    with state.sessions.flight(spec.session):
        if state.cluster.disaggregated:  # prefill instances: router/pd_legs.py runs the request's two legs
            await lookup(state, ctx, state.settings.pd is not None)
            return await pd_legs.route(state, ctx)
        if pd_legs.steers_transfer(raw):  # the router owns the transfer: a client may not steer it (router/pd_legs.py)
            pd_legs.client_params(ctx.body())
        await lookup(state, ctx)
        pool = Pool("replica", state.router, state.cluster.replicas)
        return await answer_from(state, ctx, pool, lambda target: _forward(state, ctx, target))


async def _forward(state: RouterState, ctx: RequestContext, target: Target) -> web.StreamResponse:
    """The request on the target replica, its answer passed on. The replica's head comes at the first token,
    streamed or not (``protocol.HEAD_AT_FIRST_TOKEN``): the request's prefill stops counting as queued there
    then (router/strategies/step.py), as in the simulator."""
    rep, decision, bs = target.rep, target.decision, state.settings.block_size
    # the cached tokens the index predicts there (None: no prediction)
    expected = reusable_prefix_tokens(decision.predicted_cached_blocks * bs, ctx.spec.prompt_tokens,
                                      bs) if ctx.predicted else None
    async with until_client_gone(ctx.request):
        up = await exchange(state, ctx, target, ctx.raw, {**ctx.headers, protocol.HEAD_AT_FIRST_TOKEN: "1"})
        async with up.response:
            record_prediction(state, expected, up.response.headers.get(protocol.CACHED_TOKENS_HEADER))
            out = {"Content-Type": up.response.headers.get("Content-Type", "application/json"),
                   protocol.REPLICA_HEADER: rep.replica_id, protocol.ROUTE_REASON_HEADER: decision.reason}
            return await relay(state, ctx, up, out)


# ---- monitoring ------------------------------------------------------------------------
async def health(request: web.Request) -> web.Response:
    state = _state(request)
    healthy = len(state.cluster.healthy())
    status = 200 if healthy else 503
    return web.json_response({"status": "ok" if healthy else "no_healthy_replica", "healthy_replicas": healthy,
                              "replicas": len(state.cluster.replicas), "routing": state.settings.routing,
                              "index": "memory" if state.embedded else "redis", "pid": os.getpid()}, status=status)


async def models(request: web.Request) -> web.Response:
    """The models the replicas serve (each says so on /health), as OpenAI's ``GET /v1/models``."""
    state = _state(request)
    names = sorted({r.health["model"] for r in state.cluster.replicas if r.health.get("model")})
    body = {"object": "list", "data": [{"id": n, "object": "model", "created": int(state.started), "owned_by": "kvemu"}
                                       for n in names]}
    return web.json_response(body)


async def metrics(request: web.Request) -> web.Response:
    """The router's own ``kvemu_router_*`` series, then the cluster's ``vllm:*`` series (every
    healthy replica's, labelled by ``replica_id``): a client scraping the URL it sends load to
    sees the serving metrics it expects."""
    state = _state(request)
    urls = [r.url for r in state.cluster.replicas if r.state.healthy]
    texts = await replica_metrics_texts(state.cluster.session, urls)
    body = state.metrics.exposition() + merge_vllm(texts)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def cluster_view(request: web.Request) -> web.Response:
    state = _state(request)
    raw = wants_raw_sessions(request, state.settings.serving.cluster_token)
    await _refresh_footprints(state)
    return respond(request, cluster_summary(state, raw))


def cluster_summary(state, raw_sessions: bool = False) -> dict:
    reps = state.cluster.replicas
    healthy = [r for r in reps if r.state.healthy]
    factor = state.settings.hotspot_factor
    totals = state.metrics.totals()  # every worker's, under --workers
    routed = {r.replica_id: int(totals.routed.get(r.replica_id, 0)) for r in reps}
    in_flight = {r.replica_id: int(totals.in_flight.get(r.replica_id, r.state.in_flight)) for r in reps}
    queued = {r.replica_id: int(totals.queued_tokens.get(r.replica_id, r.state.queued_tokens)) for r in reps}

    def ratio(values):
        mean = sum(values) / len(values) if values else 0.0
        return (max(values) / mean if mean else 0.0), mean

    load_ratio, load_mean = ratio([in_flight[r.replica_id] for r in healthy])
    kv_ratio, kv_mean = ratio([r.health.get("kv_usage", 0.0) for r in healthy])
    # routed: over the replicas that decode (colocated ones and a P/D cluster's decode pool), which every request
    # reaches once, as `kvemu replay` and `kvemu sim` count it; a prefill pool's is apart ("pd")
    routed_ratio, routed_mean = ratio([routed[r.replica_id] for r in healthy if r.role != "prefill"])
    prefill_mean = ratio([routed[r.replica_id] for r in healthy if r.role == "prefill"])[1]
    rows = []
    for r in reps:
        # Far above the mean, and by more than noise: a few requests do not make a hotspot.
        checks = (("in_flight", in_flight[r.replica_id], load_mean, 2), ("kv_usage", r.health.get("kv_usage", 0.0),
                  kv_mean, 0.05), ("routed", routed[r.replica_id], prefill_mean if r.role == "prefill" else routed_mean, 20))
        reasons = [name for name, value, mean, floor in checks
                   if r.state.healthy and mean and value > factor * mean and value - mean >= floor]
        rows.append({"replica_id": r.replica_id, "url": r.url, "healthy": r.state.healthy, "role": r.role,
                     "in_flight": in_flight[r.replica_id], "queued_tokens": queued[r.replica_id],
                     "kv_usage": r.health.get("kv_usage", 0.0), "running": r.health.get("running", 0),
                     "waiting": r.health.get("waiting", 0), "routed": routed[r.replica_id],
                     "event_lag": r.feed_lag_events, "top_sessions": _sessions(r.top_sessions, raw_sessions, state),
                     # P/D: what prefills held for remote decodes pin there; "exhausted": routed around
                     "held_blocks": r.health.get("held_blocks", 0), "held_usage": r.health.get("held_usage", 0.0),
                     "holds": r.health.get("holds", "ok"),
                     "hotspot": bool(reasons), "hotspot_reasons": reasons, "restarts": r.restarts})
    return {"routing": state.settings.routing, "replicas": rows, "healthy": len(healthy),
            "workers": _workers(), "requests": {k: int(v) for k, v in sorted(totals.requests.items())},
            "imbalance": {"in_flight": load_ratio, "kv_usage": kv_ratio, "routed": routed_ratio},
            "hotspot_factor": factor, "hotspots": [row["replica_id"] for row in rows if row["hotspot"]],
            # later turns of sessions, and those that left their session's replica, by the decision that moved them
            "session_moves": {"turns": int(totals.session_turns), "left": int(sum(totals.session_moves.values())),
                              "by_reason": {k: int(v) for k, v in sorted(totals.session_moves.items())}},
            **({"pd": pd_summary(state, totals)} if state.cluster.disaggregated else {}),
            **(_stores(shared_stores_summary(state)) if state.cluster.stores else {})}


def _stores(rows: list[dict]) -> dict:
    """``shared_stores``, and under its name until this release, ``shared_pools``, for one more."""
    return {"shared_stores": rows, "shared_pools": rows}


def shared_stores_summary(state) -> list[dict]:
    """Each shared KV store: whom it serves, its feed as the router follows it, its occupancy and evictions (its
    last ``/stats``: ``SharedStore.stats()`` and the store's own figures), and the blocks the replicas it serves
    found at each level (hits by level, from their ``/stats`` ``tiers``: HBM, host, SSD, the shared store)."""
    index = state.index.replicas_sync() if state.embedded else {}
    out = []
    for p in state.cluster.stores:
        st = p.stats
        serves = [r for r in state.cluster.replicas if not p.serves or r.replica_id in p.serves]
        blocks, used = st.get("blocks") or p.health.get("blocks") or 0, st.get("used_blocks", p.health.get("used_blocks"))
        known = index.get(p.store_id)
        out.append({
            "store_id": p.name, "pool_id": p.name, "url": p.url, "healthy": p.healthy, "epoch": p.epoch, "restarts": p.restarts,
            "level": state.settings.shared_level,
            "serves": list(p.serves) or "all", "event_lag": p.feed_lag_events,
            "index_blocks": known.blocks if known is not None else None,
            "index_synced": known.synced if known is not None else None,
            "blocks": blocks, "used_blocks": used, "occupancy": (used / blocks) if blocks and used is not None else None,
            "used_bytes": st.get("used_bytes"), "chunks": st.get("chunks"), "chunk_blocks": st.get("chunk_blocks"),
            "eviction": st.get("eviction"), "write": st.get("write"), "writes": st.get("writes"),
            "refused_writes": st.get("refused_writes"), "reads": st.get("reads"), "evictions": st.get("evictions"),
            "bytes_moved": st.get("bytes_moved"), "at_risk": st.get("at_risk"),
            "hits_by_level": hits_by_level(r.tier_stats for r in serves if r.state.healthy),
        })
    return out


def hits_by_level(tiers) -> dict[str, int]:
    """Blocks found at each level (``hbm``, ``host``, ``ssd``, ``shared``, ...) summed over replicas' ``tiers``
    stats (``accessed_blocks`` times each ``<level>_block_hit_ratio``)."""
    out: dict[str, int] = {}
    for t in tiers:
        n = t.get("accessed_blocks") or 0
        for key, value in t.items():
            if key.endswith("_block_hit_ratio") and key != "all_levels_block_hit_ratio" and isinstance(value, float | int):
                name = key[:-len("_block_hit_ratio")]
                out[name] = out.get(name, 0) + round(value * n)
    return out


def _max_over_mean(values: list[int]) -> float:
    """Max / mean (1 = even), 0 for nothing routed."""
    mean = sum(values) / len(values) if values else 0.0
    return max(values) / mean if mean else 0.0


def pd_summary(state, totals) -> dict:
    """A P/D cluster's pools (each replica's role), decisions per pool, the path requests took, and the
    transfer link as the replicas' /stats report it (their ``pd`` section)."""
    pools: dict[str, list[str]] = {"prefill": [], "decode": [], "both": []}
    for r in state.cluster.replicas:
        pools.setdefault(r.role, []).append(r.replica_id)
    decider = state.settings.pd
    paths = {p: int(totals.pd_paths.get(p, 0)) for p in pd_legs.PD_PATHS}
    healthy = {r.replica_id for r in state.cluster.replicas if r.state.healthy}
    routed = {pool: [int(totals.routed.get(rid, 0)) for rid in ids if rid in healthy] for pool, ids in pools.items()}
    return {"pools": pools, "decider": getattr(decider, "decider", "always"), "paths": paths,
            # max / mean requests routed over each pool's healthy replicas (the decode pool's with the colocated
            # ones is /cluster's imbalance.routed)
            "imbalance_routed": {"prefill": _max_over_mean(routed["prefill"]),
                                 "decode": _max_over_mean(routed["decode"] + routed["both"])},
            "decisions": {pool: {k: int(v) for k, v in sorted(by.items())} for pool, by in totals.pd_decisions.items()},
            "releases": {k: int(totals.pd_releases.get(k, 0)) for k in ("released", "not_held", "failed")},
            "link": {r.replica_id: r.pd_stats for r in state.cluster.replicas if r.pd_stats}}


def _workers() -> int:
    """Router processes behind this port (``--workers``): what the counts above add up."""
    return int(os.environ.get("KVEMU_ROUTER_WORKERS", "1"))


def _sessions(rows: list, raw: bool, state) -> list:
    """Replicas answer the router with raw ids (it holds the token); others see keyed hashes."""
    if raw or not state.settings.serving.cluster_token:  # without a token the replicas hashed them already
        return rows
    return [{**row, "session": session_label(row.get("session"), state.settings.serving.cluster_token)} for row in rows]


async def _refresh_footprints(state) -> None:
    async def one(rep):
        try:
            raw = "&sessions=raw" if state.settings.serving.cluster_token else ""
            async with state.cluster.session.get(rep.url + "/stats?top=5" + raw, headers=state.cluster.auth,
                                                 timeout=aiohttp.ClientTimeout(total=1.0)) as resp:
                if resp.status == 200:
                    st = await resp.json()
                    rep.top_sessions = st.get("top_sessions", [])
                    rep.pd_stats = st.get("pd") or {}
                    rep.tier_stats = st.get("tiers") or {}
                    rep.health["kv_usage"] = st.get("usage", rep.health.get("kv_usage", 0.0))
        except (TimeoutError, aiohttp.ClientError, ValueError):
            pass

    await asyncio.gather(*(one(r) for r in state.cluster.replicas if r.state.healthy),
                         *(refresh_store_stats(state, p) for p in state.cluster.stores if p.healthy))


async def refresh_store_stats(state, store) -> None:
    """A shared store's ``/stats`` into its handle (what /cluster and the dashboard show of it)."""
    try:
        async with state.cluster.session.get(store.url + "/stats", headers=state.cluster.auth,
                                             timeout=aiohttp.ClientTimeout(total=1.0)) as resp:
            if resp.status == 200:
                st = await resp.json()
                if isinstance(st, dict):
                    store.stats = st
    except (TimeoutError, aiohttp.ClientError, ValueError):
        pass


def add_routes(app: web.Application) -> None:
    for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
        app.router.add_post(path, proxy)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/cluster", cluster_view)
