"""Router metrics: decisions by strategy and reason, index latency, predicted vs actual
reuse, event lag and gaps, retries, per-replica load. Prometheus text on /metrics.

One router, however many workers: the counters, the histogram and the per-replica gauges are
prometheus_client's own, so under ``kvemu router --workers N`` (the supervisor sets
``PROMETHEUS_MULTIPROC_DIR`` for its workers) they live in prometheus_client's multiprocess
files and every worker's scrape reads all of them (``MultiProcessCollector``): a counter is the
sum over every worker that ever ran, so it never goes down when a worker dies and is replaced,
and a gauge is the sum (requests in flight, queued tokens) or the largest value (KV usage,
event lag) over the live workers. A single router keeps them in its own registry, as before.
``totals()`` reads the whole router back for ``/cluster`` and the dashboard."""

from __future__ import annotations

import asyncio
import os
from typing import Any, Literal

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.parser import text_string_to_metric_families

disable_created_metrics()  # *_created series only add noise for scrapers

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
TTFT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# name -> help of the plain counters (each is kvemu_router_<name>_total)
COUNTERS = {
    "predicted_cached_tokens": "Cached tokens the index predicted.",
    "actual_cached_tokens": "Cached tokens replicas reported.",
    "prediction_abs_error_tokens": "Sum of |predicted - actual| cached tokens.",
    "retries": "Requests retried on another replica.",
    "index_errors": "Index lookups or clears that failed.",
    "load_only_decisions": "Cache-aware decisions made without the index.",
    "events_applied": "KV events applied to the embedded index (each worker's own index counts its own).",
    "event_gaps": "Event sequence gaps detected (replica entries cleared).",
    "replica_failures": "Replicas taken out by health checks.",
    "replica_restarts": "Replica restarts detected (new epoch).",
    "replica_busy": "Answers of 503 + Retry-After (overloaded): retried elsewhere.",
    "store_failures": "Shared KV stores taken out by health checks (their index entries cleared).",
    "holds_exhausted": "Times a replica's /health said prefills held for remote decodes exhaust its KV pool (routed"
                       " around until they end, its index entries kept).",
}
# counters also counted under their name until this release, for one more (scrapers may read it): new -> old
OLD_COUNTERS = {"store_failures": "pool_failures"}
# per-replica gauges: name -> (help, how workers combine)
GaugeMode = Literal["livesum", "livemax"]
GAUGES: dict[str, tuple[str, GaugeMode]] = {
    "in_flight": ("Requests in flight per replica.", "livesum"),
    "queued_tokens": ("Prefill tokens routed whose first token is not out (prompt less the predicted hit).",
                      "livesum"),
    "kv_usage": ("KV usage reported by the replica.", "livemax"),
    "healthy": ("1 when routable (by any live worker).", "livemax"),
    "held_usage": ("Share of the replica's KV pool prefills held for remote decodes pin (P/D).", "livemax"),
    "event_lag": ("Events published but not yet applied (the slowest worker's index).", "livemax"),
}
# per shared KV store (--shared-store): name -> (help, how workers combine)
STORE_GAUGES: dict[str, tuple[str, GaugeMode]] = {
    "healthy": ("1 when the shared store answers its health checks (by any live worker).", "livemax"),
    "event_lag": ("The shared store's events published but not yet applied (the slowest worker's index).", "livemax"),
}


def multiprocess_dir() -> str | None:
    """The directory the workers share, when this process is one of ``--workers N``."""
    return os.environ.get(MULTIPROC_ENV) or None


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        shared = multiprocess_dir()
        own = None if shared else self.registry  # multiprocess: values go to the shared files, read at scrape
        if shared:
            from prometheus_client import multiprocess

            multiprocess.MultiProcessCollector(self.registry, path=shared)
        self.index_latency = Histogram("kvemu_router_index_lookup_seconds", "Prefix index lookup latency.",
                                       buckets=LATENCY_BUCKETS, registry=own)
        self.decisions = Counter("kvemu_router_decisions", "Routing decisions.", ["strategy", "reason"], registry=own)
        # a session's later turns (its earlier one routed by this router) and those sent to another replica than
        # the earlier one's, by the decision's reason: why a cache-aware run sits below its ceiling
        self.session_turns = Counter("kvemu_router_session_turns", "Requests of a session the router routed"
                                     " before (its later turns).", registry=own)
        self.session_moves = Counter("kvemu_router_session_moves", "Later turns of a session sent to another"
                                     " replica than its previous turn, by the decision's reason.", ["reason"],
                                     registry=own)
        self.requests = Counter("kvemu_router_requests", "Requests by outcome.", ["outcome"], registry=own)
        self.routed = Counter("kvemu_router_routed", "Requests sent to each replica (retries included).",
                              ["replica_id"], registry=own)
        self.predictions = Counter("kvemu_router_predictions", "Requests whose cached tokens were predicted and"
                                   " reported.", registry=own)
        self._counters = {name: Counter(f"kvemu_router_{name}", doc, registry=own) for name, doc in COUNTERS.items()}
        self._old_counters = {name: Counter(f"kvemu_router_{old}", f"{COUNTERS[name]} The old name of"
                                            f" kvemu_router_{name}_total, kept for one release.", registry=own)
                              for name, old in OLD_COUNTERS.items()}
        self._gauges = {name: Gauge(f"kvemu_router_replica_{name}", doc, ["replica_id"], registry=own,
                                    multiprocess_mode=mode) for name, (doc, mode) in GAUGES.items()}
        # each under its name until this release too (kvemu_router_shared_pool_*{pool_id}), for one more
        self._store_gauges = [{name: Gauge(f"kvemu_router_shared_{word}_{name}", doc, [label], registry=own,
                                           multiprocess_mode=mode) for name, (doc, mode) in STORE_GAUGES.items()}
                              for word, label in (("store", "store_id"), ("pool", "pool_id"))]
        # the series every request sets, by replica id, looked up once: ``labels()`` costs several times ``set()``
        self._routed: dict[str, Any] = {}
        self._load: dict[str, _LoadSeries] = {}  # its in-flight and queued-token gauges
        # P/D (router/pd_legs.py): decisions per pool, the path each request took, and the TTFT split the router sees
        self.pd_decisions = Counter("kvemu_router_pd_decisions", "P/D routing decisions per pool.", ["pool", "reason"],
                                    registry=own)
        self.pd_paths = Counter("kvemu_router_pd_requests", "P/D requests by how they were prefilled: remote (a"
                                " prefill instance), local (the decider kept it on the decoder), colocated (a"
                                " replica of role both), fallback (no prefill instance could).", ["path"],
                                registry=own)
        self.pd_prefill_seconds = Histogram("kvemu_router_pd_prefill_seconds", "Wall seconds of a remote prefill"
                                            " request (sent to answered).", buckets=TTFT_BUCKETS, registry=own)
        self.pd_decode_first_byte = Histogram("kvemu_router_pd_decode_first_byte_seconds", "Wall seconds from"
                                              " sending the decode request to its first byte (its first token when"
                                              " streamed).", ["path"], buckets=TTFT_BUCKETS, registry=own)
        self.pd_releases = Counter("kvemu_router_pd_releases", "Holds the router asked a prefill instance to release"
                                   " once their decode leg ended: released (no pull had), not_held (the decoder's"
                                   " pull had released it), failed (no answer).", ["outcome"], registry=own)
        # each restart the health checks saw (a new epoch on /health), per process; each worker counts what its own
        # checks see (under --workers N, N per restart): /cluster's ``restarts`` are the answering worker's
        self.restarts = Counter("kvemu_router_restarts", "Restarts of a replica or shared store the health checks saw"
                                " (a new epoch on its /health: its cache started empty).", ["kind", "id"], registry=own)
        self.cluster: Any = None  # the Cluster, set by the app

    def count(self, name: str, n: float = 1) -> None:
        """One of ``COUNTERS`` goes up by ``n``."""
        if n:
            self._counters[name].inc(n)
            old = self._old_counters.get(name)
            if old is not None:
                old.inc(n)

    def decided(self, strategy: str, reason: str) -> None:
        self.decisions.labels(strategy, reason).inc()

    def session_turn(self, moved_by: str) -> None:
        """A later turn of a session was routed; ``moved_by``: the reason it left its replica ("" if it stayed)."""
        self.session_turns.inc()
        if moved_by:
            self.session_moves.labels(moved_by).inc()

    def pd_decided(self, pool: str, reason: str) -> None:
        self.pd_decisions.labels(pool, reason).inc()

    def pd_path(self, path: str) -> None:
        self.pd_paths.labels(path).inc()

    def pd_release(self, outcome: str) -> None:
        self.pd_releases.labels(outcome).inc()

    def pd_first_byte(self, path: str, seconds: float) -> None:
        self.pd_decode_first_byte.labels(path).observe(seconds)

    def restarted(self, kind: str, process_id: str) -> None:
        """``kind`` ("replica" or "shared_store") ``process_id`` came back with a new epoch."""
        self.restarts.labels(kind, process_id).inc()

    def outcome(self, outcome: str) -> None:
        self.requests.labels(outcome).inc()

    def sent(self, replica_id: str) -> None:
        child = self._routed.get(replica_id)
        if child is None:
            child = self._routed[replica_id] = self.routed.labels(replica_id)
        child.inc()

    def load(self, replica_id: str, in_flight: int, queued_tokens: int) -> None:
        """The replica's load gauges, which every step of a request's path sets (router/request_path.py); a value
        that did not change since this process last set it is not set again (only this method sets them)."""
        series = self._load.get(replica_id)
        if series is None:
            series = self._load[replica_id] = _LoadSeries(self._gauges["in_flight"].labels(replica_id),
                                                          self._gauges["queued_tokens"].labels(replica_id))
        if series.last_in_flight != in_flight:
            series.in_flight.set(in_flight)
            series.last_in_flight = in_flight
        if series.last_queued != queued_tokens:
            series.queued_tokens.set(queued_tokens)
            series.last_queued = queued_tokens

    def replica(self, replica_id: str, **values: float) -> None:
        """Per-replica gauges (``GAUGES``) as this worker sees them now."""
        for name, value in values.items():
            self._gauges[name].labels(replica_id).set(value)

    def store(self, store_id: str, **values: float) -> None:
        """Per shared store gauges (``STORE_GAUGES``) as this worker sees them now."""
        for name, value in values.items():
            for gauges in self._store_gauges:
                gauges[name].labels(store_id).set(value)

    def record_prediction(self, predicted_tokens: int, actual_tokens: int) -> None:
        self.predictions.inc()
        self.count("predicted_cached_tokens", predicted_tokens)
        self.count("actual_cached_tokens", actual_tokens)
        self.count("prediction_abs_error_tokens", abs(predicted_tokens - actual_tokens))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def totals(self) -> RouterTotals:
        """The whole router's counts (every worker's, under ``--workers``), read back from the registry."""
        totals = RouterTotals()
        for fam in self.registry.collect():
            for sample in fam.samples:
                name, labels, value = sample.name, sample.labels, sample.value
                if name == "kvemu_router_routed_total":
                    totals.routed[labels["replica_id"]] = totals.routed.get(labels["replica_id"], 0) + value
                elif name == "kvemu_router_decisions_total":
                    totals.decisions[labels["reason"]] = totals.decisions.get(labels["reason"], 0) + value
                elif name == "kvemu_router_session_turns_total":
                    totals.session_turns += value
                elif name == "kvemu_router_session_moves_total":
                    totals.session_moves[labels["reason"]] = totals.session_moves.get(labels["reason"], 0) + value
                elif name == "kvemu_router_requests_total":
                    totals.requests[labels["outcome"]] = totals.requests.get(labels["outcome"], 0) + value
                elif name == "kvemu_router_pd_requests_total":
                    totals.pd_paths[labels["path"]] = totals.pd_paths.get(labels["path"], 0) + value
                elif name == "kvemu_router_pd_releases_total":
                    totals.pd_releases[labels["outcome"]] = totals.pd_releases.get(labels["outcome"], 0) + value
                elif name == "kvemu_router_pd_decisions_total":
                    pool = totals.pd_decisions.setdefault(labels["pool"], {})
                    pool[labels["reason"]] = pool.get(labels["reason"], 0) + value
                elif name == "kvemu_router_replica_in_flight":
                    totals.in_flight[labels["replica_id"]] = value
                elif name == "kvemu_router_replica_queued_tokens":
                    totals.queued_tokens[labels["replica_id"]] = value
        return totals


class _LoadSeries:
    """One replica's in-flight and queued-token gauges (labelled children) and the values last set on them."""

    __slots__ = ("in_flight", "last_in_flight", "last_queued", "queued_tokens")

    def __init__(self, in_flight: Any, queued_tokens: Any) -> None:
        self.in_flight, self.queued_tokens = in_flight, queued_tokens
        self.last_in_flight: int | None = None
        self.last_queued: int | None = None


class GuardMirror:
    """Under ``--workers``: the connection guard's counts (``shared.http_server.ConnGuard``, plain ints a
    worker keeps) copied into multiprocess metrics by ``sync`` (once a second), so connections cut
    and open add up over the workers like the rest."""

    REASONS = (("head_timeout", "timed_out"), ("write_timeout", "write_timed_out"), ("over_cap", "refused"))

    def __init__(self, guard: Any, prefix: str) -> None:
        self.guard = guard
        self.cut = Counter(f"{prefix}connections_cut", "Client connections the server cut: request head too slow,"
                           " client not reading its response, or over the connection cap.", ["reason"], registry=None)
        self.open = Gauge(f"{prefix}open_connections", "Open client connections.", registry=None,
                          multiprocess_mode="livesum")
        self._seen = dict.fromkeys((reason for reason, _ in self.REASONS), 0)

    def sync(self) -> None:
        for reason, attr in self.REASONS:
            now = getattr(self.guard, attr)
            if now > self._seen[reason]:
                self.cut.labels(reason).inc(now - self._seen[reason])
                self._seen[reason] = now
        self.open.set(len(self.guard.open))

    async def loop(self, interval_s: float = 1.0) -> None:
        while True:
            self.sync()
            await asyncio.sleep(interval_s)


class RouterTotals:
    """What ``/cluster`` and the dashboard show for the whole router."""

    __slots__ = ("decisions", "in_flight", "pd_decisions", "pd_paths", "pd_releases", "queued_tokens", "requests",
                 "routed", "session_moves", "session_turns")

    def __init__(self) -> None:
        self.routed: dict[str, float] = {}
        self.decisions: dict[str, float] = {}  # by reason, summed over strategies
        self.requests: dict[str, float] = {}  # by outcome
        self.in_flight: dict[str, float] = {}
        self.queued_tokens: dict[str, float] = {}
        self.pd_paths: dict[str, float] = {}  # P/D requests by path (router/pd_legs.py)
        self.pd_decisions: dict[str, dict[str, float]] = {}  # pool -> reason -> decisions
        self.pd_releases: dict[str, float] = {}  # holds the router released, by outcome (router/pd_legs.py)
        self.session_turns = 0.0  # later turns of sessions (router/views.py's _decide)
        self.session_moves: dict[str, float] = {}  # of them, sent to another replica than the turn before, by reason


# ---- the cluster's vLLM series, merged from the replicas at scrape time --------------------
class _Families:
    """A one-shot collector over already-built metric families."""

    def __init__(self, families) -> None:
        self.families = families

    def collect(self):
        return self.families


def _written_name(fam) -> str:
    """The name a family's ``# HELP`` / ``# TYPE`` lines carry in the text format: the parser drops a
    counter's ``_total``, which the exposition writes back."""
    return fam.name + "_total" if fam.type == "counter" else fam.name


def merge_vllm(texts: list[str]) -> bytes:
    """The ``vllm:*`` families of every replica's exposition as one exposition, each family's ``# HELP`` and
    ``# TYPE`` once (the text format refuses a family declared twice): each series keeps its ``model_name``
    and ``replica_id`` labels, so sums over them are cluster totals. Families are merged by the name they are
    written under, not the parser's: a counter one replica declares as ``x_total`` and another as ``x``
    (whose ``x_total`` samples the parser then hands over as an untyped family of their own) is one family."""
    merged: dict[str, Any] = {}  # written name -> prometheus_client Metric family
    for text in texts:
        try:
            families = list(text_string_to_metric_families(text))
        except ValueError:  # a replica mid-restart sent a torn page: skip it this scrape
            continue
        for fam in families:
            if not fam.name.startswith("vllm:"):
                continue
            have = merged.setdefault(_written_name(fam), fam)
            if have is fam:
                continue
            if have.type == "unknown" and fam.type != "unknown":  # stray samples came first: the typed family leads
                fam.samples[:0] = have.samples
                merged[_written_name(fam)] = fam
            else:
                have.samples.extend(fam.samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(list(merged.values())))
    return generate_latest(registry)


async def replica_metrics_texts(session: aiohttp.ClientSession, urls: list[str], timeout_s: float = 2.0) -> list[str]:
    async def one(url: str) -> str:
        try:
            async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                return await resp.text() if resp.status == 200 else ""
        except (TimeoutError, aiohttp.ClientError, UnicodeDecodeError):
            return ""

    return list(await asyncio.gather(*(one(u) for u in urls)))
