"""The rounds: on each cluster in turn, latency segments (open loop) and closed-loop
segments, with the CPU each process spent, and the check that declares a cluster broken."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from .cluster import Cluster
from .load import Prompts, closed_loop, new_session, open_loop
from .procs import Procs
from .report import dist
from .settings import log


def cpu_delta(before: dict, after: dict, wall: float, requests: int) -> dict:
    d = {k: after[k] - before[k] for k in before}
    out = {f"{k}_cpu_util": round(max(v, 0.0) / wall, 3) for k, v in d.items()}
    if requests:
        out.update({f"{k}_cpu_us_per_req": round(v / requests * 1e6, 1) for k, v in d.items() if k != "foreign"})
    return out


def index_latency(before: dict, after: dict) -> dict:
    """Mean and bucket-bound p50/p99 of the router's index lookups between two scrapes."""
    name = "kvemu_router_index_lookup_seconds"
    n = after.get(f"{name}_count", 0) - before.get(f"{name}_count", 0)
    if n <= 0:
        return {"lookups": 0}
    total = after.get(f"{name}_sum", 0) - before.get(f"{name}_sum", 0)
    buckets = sorted((float(k.split('le="')[1].split('"')[0]), after[k] - before.get(k, 0))
                     for k in after if k.startswith(f"{name}_bucket"))

    def bound(q: float) -> float | None:
        for le, cum in buckets:
            if cum >= q * n:
                return le * 1000
        return None

    errs = sum(after.get(k, 0) - before.get(k, 0) for k in after if k.startswith("kvemu_router_index_errors"))
    return {"lookups": int(n), "mean_ms": round(total / n * 1000, 4), "p50_ms_at_most": bound(0.5),
            "p99_ms_at_most": bound(0.99), "index_errors": int(errs)}


async def latency_segment(cl: Cluster, target: str, prompts: Prompts, a) -> tuple[dict, list[float]]:
    urls = [cl.url + "/generate"] if target == "router" else [u + "/generate" for u in cl.replica_urls]
    async with new_session() as s:
        await open_loop(s, urls, prompts, a.rate, max(50, a.rate // 10))  # open connections, settle
        m0 = await cl.router_metrics(s)
        c0 = cl.cpu()
        r = await open_loop(s, urls, prompts, a.rate, a.latency_requests)
        c1 = cl.cpu()
        m1 = await cl.router_metrics(s)
    seg = {"target": target, **dist(r["lat"]), "errors": r["errors"], "achieved_rate": round(r["achieved_rate"], 1),
           "launch_lag_ms_p99": round(r["lag_p99"], 3), "max_in_flight": r["max_in_flight"],
           **cpu_delta(c0, c1, r["wall"], len(r["lat"]))}
    if target == "router":
        seg["index_lookup"] = index_latency(m0, m1)
    return seg, r["lat"]


async def throughput_segment(cl: Cluster, target: str, prompts: Prompts, a) -> dict:
    urls = [cl.url + "/generate"] if target == "router" else [u + "/generate" for u in cl.replica_urls]
    async with new_session(limit=a.concurrency) as s:
        await closed_loop(s, urls, prompts, a.concurrency, 0.3)  # open the connections
        c0 = cl.cpu()
        r = await closed_loop(s, urls, prompts, a.concurrency, a.throughput_seconds)
        c1 = cl.cpu()
    return {"target": target, "requests_per_s": round(r["rps"], 1), "requests": r["requests"],
            "errors": r["errors"], **cpu_delta(c0, c1, r["wall"], r["requests"])}


async def idle_cpu(cl: Cluster, seconds: float) -> dict:
    """Background CPU of the cluster with no traffic (feed polling, health checks, heartbeats)."""
    c0 = cl.cpu()
    await asyncio.sleep(seconds)
    c1 = cl.cpu()
    return {k: round(v, 4) for k, v in cpu_delta(c0, c1, seconds, 0).items() if k != "client_cpu_util"}


class ClusterBroken(Exception):
    """Too many requests of a segment failed: the cluster is not fit to measure any more."""

    def __init__(self, segment: str, errors: dict) -> None:
        super().__init__(segment)
        self.segment, self.errors = segment, errors


MAX_ERROR_FRACTION = 0.02


def _check(seg: dict, what: str, ok: int) -> None:
    n_err = sum(seg["errors"].values())
    if n_err and n_err > MAX_ERROR_FRACTION * (ok + n_err):
        raise ClusterBroken(what, seg["errors"])


async def one_round(cl: Cluster, mode: str, rnd: int, layout: dict, thr_layout: dict, prompts: Prompts, a):
    """Latency (direct and routed, order alternating per round), then closed loop (reverse order)."""
    cl.pin(layout)
    seg, lat = {}, {}
    targets = ("direct", "router") if rnd % 2 == 0 else ("router", "direct")
    for target in targets:
        seg[target], lat[target] = await latency_segment(cl, target, prompts, a)
        log(f"round {rnd + 1}/{a.rounds} {mode:6} latency {target:6}: p50 {seg[target]['p50_ms']} ms,"
            f" p99 {seg[target]['p99_ms']} ms, errors {seg[target]['errors'] or 0},"
            f" other load {seg[target]['foreign_cpu_util']} cores")
        _check(seg[target], f"latency {target}", seg[target]["n"])
    cl.pin(thr_layout)
    thr = {}
    for target in reversed(targets):
        thr[target] = await throughput_segment(cl, target, prompts, a)
        log(f"round {rnd + 1}/{a.rounds} {mode:6} closed loop {target:6}: "
            f"{thr[target]['requests_per_s']} req/s, errors {thr[target]['errors'] or 0},"
            f" other load {thr[target]['foreign_cpu_util']} cores")
        _check(thr[target], f"closed loop {target}", thr[target]["requests"])
    return seg, lat, thr


@dataclass
class Rounds:
    """What the rounds measured, by cluster name (``memory``, ``redis``)."""

    lat: dict[str, list[dict]]  # per round: latency segments by target (direct, router)
    pooled: dict[str, dict[str, list[float]]]  # every latency sample by target, all rounds
    thr: dict[str, list[dict]]  # per round: closed-loop segments by target
    idle: dict[str, dict] = field(default_factory=dict)
    health: dict[str, dict] = field(default_factory=dict)
    failed: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def empty(cls, modes) -> Rounds:
        return cls({m: [] for m in modes}, {m: {"direct": [], "router": []} for m in modes}, {m: [] for m in modes})


async def run_rounds(clusters: dict[str, Cluster], procs: Procs, layout: dict, thr_layout: dict,
                     prompts: Prompts, a) -> Rounds:
    """``a.rounds`` rounds, the clusters' order alternating; only the measured cluster runs,
    the other stays frozen. A broken cluster sits out the rounds that remain."""
    out = Rounds.empty(clusters)
    for cl in clusters.values():
        cl.freeze()
    for rnd in range(a.rounds):
        order = list(clusters) if rnd % 2 == 0 else list(reversed(clusters))
        for mode in order:
            if mode in out.failed:
                continue
            cl = clusters[mode]
            async with new_session() as s:
                await cl.thaw(s)
            try:
                await _measure_round(cl, mode, rnd, out, layout, thr_layout, prompts, a)
            except ClusterBroken as exc:
                await _record_failure(cl, mode, rnd, exc, out, procs)
            finally:
                cl.freeze()
    return out


async def _measure_round(cl: Cluster, mode: str, rnd: int, out: Rounds, layout: dict, thr_layout: dict,
                         prompts: Prompts, a) -> None:
    if rnd == 0:
        out.idle[mode] = await idle_cpu(cl, a.idle_seconds)
    lat_seg, lat, thr = await one_round(cl, mode, rnd, layout, thr_layout, prompts, a)
    out.lat[mode].append(lat_seg)
    for target in lat:
        out.pooled[mode][target].extend(lat[target])
    out.thr[mode].append(thr)
    async with new_session() as s:
        if rnd == a.rounds - 1:
            out.health[mode] = await cl.health_report(s)
        await cl.quiesce(s)


async def _record_failure(cl: Cluster, mode: str, rnd: int, exc: ClusterBroken, out: Rounds, procs: Procs) -> None:
    out.failed[mode] = {"round": rnd + 1, "segment": exc.segment, "errors": exc.errors,
                        "replica_log_errors": procs.log_errors(cl.replica_procs),
                        "router_log_errors": procs.log_errors([cl.router_proc]),
                        "replicas_at_failure": await cl.replica_snapshot()}
    log(f"{mode} cluster failed in round {rnd + 1} ({exc.segment}): its remaining rounds are skipped;"
        f" replica logs say {out.failed[mode]['replica_log_errors'] or 'nothing'}")
    with contextlib.suppress(Exception):
        async with new_session() as s:
            out.health[mode] = await cl.health_report(s)
