"""Prometheus exposition: vLLM's metric names where one exists, kvemu_* for the rest.

Cache counters live in the pool's metrics; a collector reads them at scrape time, so the
serving path never touches a Prometheus object except the TTFT histogram.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


def make_registry() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry(auto_describe=True)
    ttft = Histogram("vllm:time_to_first_token_seconds", "Emulated time to first token.", buckets=TTFT_BUCKETS,
                     registry=registry)
    return registry, ttft


class ReplicaCollector:
    def __init__(self, state) -> None:
        self.state = state

    def describe(self):
        return []

    def collect(self):
        st = self.state
        m = st.pool.metrics
        rid = st.settings.replica_id
        labels = ["replica_id"]

        def counter(name, doc, value):
            fam = CounterMetricFamily(name, doc, labels=labels)
            fam.add_metric([rid], value)
            return fam

        def gauge(name, doc, value):
            fam = GaugeMetricFamily(name, doc, labels=labels)
            fam.add_metric([rid], value)
            return fam

        yield counter("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", m.tokens_queried)
        yield counter("vllm:prefix_cache_hits", "Prompt tokens served from the prefix cache.", m.tokens_hit)
        yield gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (0-1).", st.pool.usage())
        yield gauge("vllm:num_requests_running", "Requests running.", st.scheduler.num_running)
        yield gauge("vllm:num_requests_waiting", "Requests waiting.", st.scheduler.num_waiting)
        yield counter("kvemu_block_accesses", "Prompt blocks looked up.", m.block_accesses)
        yield counter("kvemu_block_hits", "Prompt blocks reused.", m.block_hits)
        yield gauge("kvemu_csr", "Compute-savings ratio: recompute cost of hits / of all accesses.",
                    m.counts().csr)
        yield counter("kvemu_holes", "Gaps of recomputed blocks before a reused block.", m.holes_total)
        yield counter("kvemu_evictions", "Blocks evicted.", m.evictions)
        yield counter("kvemu_one_hit_evictions", "Evicted blocks that were never reused.", m.one_hit_evictions)
        yield gauge("kvemu_capacity_blocks", "KV blocks in the pool.", st.pool.capacity)
        yield counter("kvemu_events_published", "KV events published.", st.feed.published_events)
        yield counter("kvemu_event_batches_dropped", "KV event batches lost (each followed by a resync).",
                      st.feed.dropped_batches)
        yield from self._reuse()

    def _reuse(self):
        tracker = self.state.pool.metrics.reuse
        if tracker is None:
            return
        rid = self.state.settings.replica_id
        fam = GaugeMetricFamily("kvemu_lru_hit_ratio_at_capacity",
                                "Miss-ratio curve from sampled reuse distances: LRU hit ratio at a capacity.",
                                labels=["replica_id", "capacity_blocks"])
        # A fixed set of capacities (multiples of this pool's) keeps the label series stable.
        cap = self.state.pool.capacity
        points = sorted({max(1, int(cap * f)) for f in (0.125, 0.25, 0.5, 1, 2, 4, 8)})
        for c, hit in tracker.miss_ratio_curve(points):
            fam.add_metric([rid, str(c)], hit)
        yield fam
