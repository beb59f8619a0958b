"""Router metrics: decisions by strategy and reason, index latency, predicted vs actual
reuse, event lag and gaps, retries, per-replica load. Prometheus text on /metrics.

The per-request counters are plain ints and lists read at scrape time (the router is one
thread): prometheus_client's own take a lock and cost about a microsecond each."""

from __future__ import annotations

import asyncio
import math
from bisect import bisect_left
from itertools import accumulate
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

disable_created_metrics()  # *_created series only add noise for scrapers

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)


class Buckets:
    """A Prometheus histogram's counts (``le`` buckets and a sum), without its lock."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def family(self, name: str, doc: str) -> HistogramMetricFamily:
        edges = [floatToGoString(b) for b in (*self.bounds, math.inf)]
        return HistogramMetricFamily(name, doc, buckets=list(zip(edges, accumulate(self.counts))),
                                     sum_value=self.total)


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.index_latency = Buckets(LATENCY_BUCKETS)
        self.decisions: dict[tuple[str, str], int] = {}  # (strategy, reason) -> routing decisions
        self.requests: dict[str, int] = {}  # outcome -> requests
        self.predicted_cached_tokens = 0
        self.actual_cached_tokens = 0
        self.prediction_abs_error_tokens = 0
        self.predictions = 0
        self.retries = 0
        self.index_errors = 0
        self.load_only_decisions = 0
        self.events_applied = 0
        self.event_gaps = 0
        self.replica_failures = 0
        self.replica_restarts = 0
        self.replica_busy = 0
        self.cluster: Any = None  # the Cluster, set by the app; read at scrape time
        self.registry.register(_Collector(self))

    def decided(self, strategy: str, reason: str) -> None:
        key = (strategy, reason)
        self.decisions[key] = self.decisions.get(key, 0) + 1

    def outcome(self, outcome: str) -> None:
        self.requests[outcome] = self.requests.get(outcome, 0) + 1

    def decisions_by_reason(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for (_, reason), n in self.decisions.items():
            out[reason] = out.get(reason, 0.0) + n
        return out

    def record_prediction(self, predicted_tokens: int, actual_tokens: int) -> None:
        self.predictions += 1
        self.predicted_cached_tokens += predicted_tokens
        self.actual_cached_tokens += actual_tokens
        self.prediction_abs_error_tokens += abs(predicted_tokens - actual_tokens)


class _Collector:
    def __init__(self, m: RouterMetrics) -> None:
        self.m = m

    def describe(self):
        return []

    def collect(self):
        m = self.m
        decisions = CounterMetricFamily("kvemu_router_decisions", "Routing decisions.", labels=["strategy", "reason"])
        for labels, n in sorted(m.decisions.items()):
            decisions.add_metric(labels, n)
        yield decisions
        yield m.index_latency.family("kvemu_router_index_lookup_seconds", "Prefix index lookup latency.")
        requests = CounterMetricFamily("kvemu_router_requests", "Requests by outcome.", labels=["outcome"])
        for outcome, n in sorted(m.requests.items()):
            requests.add_metric([outcome], n)
        yield requests
        for name, doc, value in (
            ("kvemu_router_predicted_cached_tokens", "Cached tokens the index predicted.", m.predicted_cached_tokens),
            ("kvemu_router_actual_cached_tokens", "Cached tokens replicas reported.", m.actual_cached_tokens),
            ("kvemu_router_prediction_abs_error_tokens", "Sum of |predicted - actual| cached tokens.",
             m.prediction_abs_error_tokens),
            ("kvemu_router_retries", "Requests retried on another replica.", m.retries),
            ("kvemu_router_index_errors", "Index lookups or clears that failed.", m.index_errors),
            ("kvemu_router_load_only_decisions", "Cache-aware decisions made without the index.",
             m.load_only_decisions),
            ("kvemu_router_events_applied", "KV events applied to the embedded index.", m.events_applied),
            ("kvemu_router_event_gaps", "Event sequence gaps detected (replica entries cleared).", m.event_gaps),
            ("kvemu_router_replica_failures", "Replicas taken out by health checks.", m.replica_failures),
            ("kvemu_router_replica_restarts", "Replica restarts detected (new epoch).", m.replica_restarts),
            ("kvemu_router_replica_busy", "Answers of 503 + Retry-After (overloaded): retried elsewhere.",
             m.replica_busy),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        if m.cluster is None:
            return
        fams = {
            "in_flight": GaugeMetricFamily("kvemu_router_replica_in_flight", "Requests in flight per replica.",
                                           labels=["replica_id"]),
            "queued": GaugeMetricFamily("kvemu_router_replica_queued_tokens", "Prompt tokens routed, not done.",
                                        labels=["replica_id"]),
            "usage": GaugeMetricFamily("kvemu_router_replica_kv_usage", "KV usage reported by the replica.",
                                       labels=["replica_id"]),
            "healthy": GaugeMetricFamily("kvemu_router_replica_healthy", "1 when routable.", labels=["replica_id"]),
            "lag": GaugeMetricFamily("kvemu_router_replica_event_lag", "Events published but not yet applied.",
                                     labels=["replica_id"]),
        }
        for rep in m.cluster.replicas:
            labels = [rep.replica_id]
            fams["in_flight"].add_metric(labels, rep.state.in_flight)
            fams["queued"].add_metric(labels, rep.state.queued_tokens)
            fams["usage"].add_metric(labels, rep.state.kv_usage)
            fams["healthy"].add_metric(labels, 1.0 if rep.state.healthy else 0.0)
            fams["lag"].add_metric(labels, rep.feed_lag_events)
        yield from fams.values()


# ---- the cluster's vLLM series, merged from the replicas at scrape time --------------------
class _Families:
    """A one-shot collector over already-built metric families."""

    def __init__(self, families) -> None:
        self.families = families

    def collect(self):
        return self.families


def merge_vllm(texts: list[str]) -> bytes:
    """The ``vllm:*`` families of every replica's exposition as one exposition: each series keeps
    its ``model_name`` and ``replica_id`` labels, so sums over them are cluster totals."""
    merged: dict[str, Any] = {}  # name -> prometheus_client Metric family
    for text in texts:
        try:
            families = list(text_string_to_metric_families(text))
        except ValueError:  # a replica mid-restart sent a torn page: skip it this scrape
            continue
        for fam in families:
            if not fam.name.startswith("vllm:"):
                continue
            if fam.name in merged:
                merged[fam.name].samples.extend(fam.samples)
            else:
                merged[fam.name] = fam
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
