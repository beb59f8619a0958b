"""A client that leaves the router leaves the replica too: the router closes its connection to
the replica, which aborts the request (vLLM does). Real processes: one replica at time scale 1
(20,000 tokens decode for half a minute) behind a real router."""

from __future__ import annotations

import time

import pytest

from tests.support.abandon import Abandoned, assert_aborted, counts, wait_running
from tests.support.cluster import metric, scrape, start_router, stop_all
from tests.support.procs import start_replica

pytestmark = pytest.mark.slow

LONG = 20_000
PROMPT = list(range(2000, 2200))


@pytest.fixture(scope="module")
def cluster():
    replica = start_replica(time_scale=1.0, capacity_blocks=4000)
    router = None
    try:
        router = start_router([replica.url])
        yield router, replica
    finally:
        stop_all(router, replica)


def disconnected(router_url: str) -> float:
    return metric(scrape(router_url), "kvemu_router_requests_total", outcome="client_disconnected")


@pytest.mark.parametrize("path, body, stream", [
    ("/v1/completions", {"prompt": PROMPT, "stream": True}, True),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "go on"}], "stream": True}, True),
    ("/generate", {"token_ids": PROMPT}, False),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "go on"}]}, False),
], ids=["completions-stream", "chat-stream", "generate", "chat"])
def test_a_client_that_leaves_the_router_aborts_its_request_on_the_replica(cluster, path, body, stream):
    router, replica = cluster
    before, gone = counts(replica.url), disconnected(router.url)
    client = Abandoned(router.url, path, {**body, "max_tokens": LONG})
    if stream:
        client.read_until(b"data: ")
    time.sleep(1.0)
    assert wait_running(replica.url, 1)["pinned_blocks"] > 0
    client.close()
    assert_aborted(replica.url, before)
    assert disconnected(router.url) == gone + 1
