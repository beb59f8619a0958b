"""loadgen/locustfile.py driven by the real Locust CLI (headless, as a subprocess) against a real
cluster (router + 3 replicas from ``kvemu.up.bring_up``).

Locust is never imported into the pytest process: importing it monkey-patches the interpreter
with gevent, which would change every other test's sockets and threads.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvemu import up
from tests.support.cluster import metric, scrape, wait_for

# Real processes on loopback: an end-to-end test (CI runs it; `-m "not slow"` skips it locally).
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
LOCUSTFILE = REPO / "loadgen" / "locustfile.py"


def locust_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "locust"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "locust"]


def run_locust(host: str, csv_prefix: Path, *extra: str, users: int = 6, run_time: str = "8s",
               timeout: float = 60.0) -> subprocess.CompletedProcess:
    args = [*locust_cmd(), "-f", str(LOCUSTFILE), "--headless", "-u", str(users), "-r", str(users), "-t", run_time,
            "--host", host, "--csv", str(csv_prefix), "--only-summary", "--stop-timeout", "5", *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LOCUST_", "KVEMU_"))}
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def read_stats(csv_prefix: Path) -> dict[tuple[str, str], dict[str, str]]:
    with open(f"{csv_prefix}_stats.csv", newline="") as fh:
        return {(row["Type"], row["Name"]): row for row in csv.DictReader(fh)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    parser = argparse.ArgumentParser()
    up.configure(parser)
    a = parser.parse_args(["--replicas", "3", "--port", "0", "--time-scale", "0.02", "--capacity-blocks", "20000"])
    c = up.bring_up(up.validate(a), log_dir=str(tmp_path_factory.mktemp("cluster-logs")))
    try:
        yield c
    finally:
        c.stop(grace=10.0)


def test_locust_headless_mix_streams_and_reports_ttft(cluster, tmp_path):
    out = tmp_path / "out"
    proc = run_locust(cluster.router_url, out, "--kvemu-think-scale", "0.02", "--kvemu-max-tokens", "16")
    assert proc.returncode == 0, f"locust exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    stats = read_stats(out)
    for kind in ("single", "chat", "agent"):
        request, ttft = stats.get(("POST", kind)), stats.get(("TTFT", kind))
        assert request is not None, f"no {kind} requests: {sorted(stats)}"
        assert int(request["Request Count"]) > 0, request
        assert ttft is not None and int(ttft["Request Count"]) > 0, f"no TTFT for {kind}: {sorted(stats)}"
        # one TTFT sample per successful streamed request, never longer than the request itself
        assert int(ttft["Request Count"]) == int(request["Request Count"]), (ttft, request)
        assert float(ttft["Average Response Time"]) <= float(request["Average Response Time"]), (ttft, request)
        assert int(request["Failure Count"]) == 0, request
    aggregated = stats[("", "Aggregated")]
    assert int(aggregated["Failure Count"]) == 0, (aggregated, Path(f"{out}_failures.csv").read_text())
    # the Aggregated row counts HTTP requests only, never the TTFT samples
    posts = sum(int(row["Request Count"]) for (kind, _), row in stats.items() if kind == "POST")
    assert int(aggregated["Request Count"]) == posts, (aggregated, posts)
    # multi-turn sessions resend their history and share system prompts: the router routed by cache hits
    samples = scrape(cluster.router_url)
    assert metric(samples, "kvemu_router_decisions_total", reason="cache_hit") > 0
    assert not cluster.dead(), [c.name for c in cluster.dead()]
    # the users read every stream to its end: the router never wrote to a connection the client dropped
    router_log = (Path(cluster.tmpdir) / "router.log").read_text(errors="replace")
    assert "Cannot write to closing transport" not in router_log, router_log[-2000:]


def test_locust_weights_and_bad_options(cluster, tmp_path):
    out = tmp_path / "weighted"
    proc = run_locust(cluster.router_url, out, "--kvemu-think-scale", "0.02", "--kvemu-max-tokens", "4",
                      "--kvemu-weights", "single=0,chat=1,agent=1", "--kvemu-set", "agent.turns_mean=20",
                      users=2, run_time="3s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = read_stats(out)
    assert ("POST", "single") not in stats, sorted(stats)  # weight 0 removes the class
    assert int(stats[("POST", "chat")]["Request Count"]) > 0 and int(stats[("POST", "agent")]["Request Count"]) > 0

    bad = run_locust(cluster.router_url, tmp_path / "bad", "--kvemu-set", "chat.gap_median=-1", users=1,
                     run_time="2s", timeout=30.0)
    assert bad.returncode == 2 and "--kvemu-set chat.gap_median" in bad.stderr, bad.stderr[-2000:]


def test_locust_counts_a_request_past_its_timeout_as_failed_and_the_replica_aborts_it(cluster, tmp_path):
    """Single-turn requests asking for ~60,000 tokens (seconds of streaming at this time scale) and
    --kvemu-timeout 1: each fails as "timed out after 1 s" (one row in Locust's failures), and the
    dropped connection makes the replica abort it: the replicas count the aborts, none runs on."""
    def aborted() -> float:
        return sum(metric(scrape(u), "kvemu_requests_aborted_total") for u in cluster.replica_urls)

    before = aborted()
    out = tmp_path / "timeout"
    proc = run_locust(cluster.router_url, out, "--kvemu-think-scale", "0.02", "--kvemu-timeout", "1",
                      "--kvemu-weights", "single=1,chat=0,agent=0", "--kvemu-set",
                      "single.response_median=60000,single.response_sigma=0.01",  # all that long: none a short draw
                      users=2, run_time="4s")
    assert proc.returncode == 1, proc.stderr[-3000:]  # failures: Locust exits 1
    single = read_stats(out)[("POST", "single")]
    assert int(single["Failure Count"]) >= 2 and int(single["Failure Count"]) == int(single["Request Count"]), single
    with open(f"{out}_failures.csv", newline="") as fh:
        failures = list(csv.DictReader(fh))
    assert [row["Error"] for row in failures] == ["CatchResponseError('timed out after 1 s')"], failures
    assert aborted() - before >= int(single["Failure Count"])
    wait_for(lambda: all(metric(scrape(u), "vllm:num_requests_running") == 0 for u in cluster.replica_urls),
             timeout=3.0, what="no request left running")
