"""A router in front of real replica processes, plus the small tools the router tests share:
Prometheus text parsing, bounded waiting, and a bounded concurrent client."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from prometheus_client.parser import text_string_to_metric_families

from shared.index import RedisIndex
from tests.conftest import free_port
from tests.support.procs import Proc, cluster_auth, http, http_json


def start_router(replica_urls, *extra: str, routing: str = "cache_aware", index: str = "memory",
                 health_interval: float = 0.2, port: int | None = None, wait_replicas: int | None = None) -> Proc:
    """``python -m kvemu router`` on a free port; returns once it sees ``wait_replicas`` healthy replicas
    (default: all of them)."""
    port = port or free_port()
    args = ["-m", "kvemu", "router", "--port", str(port), "--replicas", ",".join(replica_urls), "--routing", routing,
            "--index", index, "--health-interval", str(health_interval), "--seed", "7", *extra]
    proc = Proc(args, port)
    try:
        proc.wait_healthy()
        want = len(replica_urls) if wait_replicas is None else wait_replicas
        wait_for(lambda: http_json("GET", proc.url + "/health", timeout=2.0)[1].get("healthy_replicas", 0) >= want,
                 timeout=15.0, what=f"{want} healthy replicas behind the router")
    except BaseException:
        proc.stop()
        raise
    return proc


def stop_all(*procs) -> None:
    for p in procs:
        if p is not None:
            try:
                p.stop()
            except Exception:  # keep stopping the others
                pass


def wait_for(pred, timeout: float = 10.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
        except OSError as exc:  # a server still starting or already gone
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"{what} not met within {timeout}s (last value: {last!r})")


# ---- Prometheus text --------------------------------------------------------------------------
def scrape(url: str) -> dict:
    """``{(sample name, frozenset(labels.items())): value}`` from ``url/metrics``."""
    status, _, data = http("GET", url + "/metrics", timeout=5.0)
    assert status == 200, status
    out = {}
    for fam in text_string_to_metric_families(data.decode()):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def metric(samples: dict, name: str, **labels) -> float:
    """Sum of the samples called ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, lab), v in samples.items() if n == name and want <= lab)


# ---- requests --------------------------------------------------------------------------------
def generate(url: str, tokens, max_tokens: int = 1, headers=None, timeout: float = 30.0):
    """POST /generate with token ids: (status, headers, parsed body)."""
    status, hdrs, data = http("POST", url + "/generate", {"token_ids": list(tokens), "max_tokens": max_tokens},
                              headers=headers, timeout=timeout)
    return status, hdrs, json.loads(data) if data else None


def sse_events(data: bytes) -> list[str]:
    return [chunk[6:] for chunk in data.decode().split("\n\n") if chunk.startswith("data: ")]


def wait_indexed(router_url: str, replica_urls) -> None:
    """Until a router's embedded index applied every event the replicas have published so far."""
    published = sum(http_json("GET", u + "/kv/events?after=0&limit=1", headers=cluster_auth())[1]["next_seq"] - 1
                    for u in replica_urls)
    wait_for(lambda: metric(scrape(router_url), "kvemu_router_events_applied_total") >= published, timeout=5.0,
             what=f"{published} events applied to the embedded index")


def cluster_row(router_url: str, replica_id: str) -> dict:
    view = http_json("GET", router_url + "/cluster", timeout=5.0)[1]
    return next(r for r in view["replicas"] if r["replica_id"] == replica_id)


def redis_lookup(url: str, cluster: str, hashes) -> dict:
    async def go():
        index = RedisIndex(url, cluster=cluster)
        try:
            return await index.lookup(list(hashes))
        finally:
            await index.close()

    return asyncio.run(go())


class LoadResult:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outcomes: Counter = Counter()
        self.replicas: Counter = Counter()
        self.errors: list[str] = []
        self.started = 0

    def add(self, outcome: str, replica: str | None = None, error: str | None = None) -> None:
        with self.lock:
            self.outcomes[outcome] += 1
            if replica:
                self.replicas[replica] += 1
            if error and len(self.errors) < 20:
                self.errors.append(error)


def run_load(url: str, bodies, concurrency: int, path: str = "/generate", headers_for=None,
             timeout: float = 30.0, result: LoadResult | None = None) -> LoadResult:
    """Send every body with ``concurrency`` client threads; classify each answer.

    Outcomes: ``200``, ``503+retry-after``, ``other:<status>`` (any other status, or a 503
    without Retry-After) and ``exception`` (a connection error or timeout at the client).
    """
    result = result or LoadResult()

    def one(i_body):
        i, body = i_body
        hdrs = headers_for(i) if headers_for else None
        with result.lock:
            result.started += 1
        try:
            status, h, data = http("POST", url + path, body, headers=hdrs, timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - any client-side failure is a lost request
            result.add("exception", error=f"{type(exc).__name__}: {exc}")
            return
        if status == 200:
            result.add("200", h.get("X-Kvemu-Replica"))
        elif status == 503 and h.get("Retry-After"):
            result.add("503+retry-after")
        else:
            result.add(f"other:{status}", error=data[:200].decode(errors="replace"))

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, enumerate(bodies)))
    return result


def start_load(*args, **kwargs):
    """``run_load`` in a background thread: (thread, result)."""
    result = kwargs.pop("result", None) or LoadResult()
    t = threading.Thread(target=run_load, args=args, kwargs={**kwargs, "result": result}, daemon=True)
    t.start()
    return t, result
