"""A client that goes away aborts its request (vLLM does): a real replica process at time scale 1,
so that a request asking for 20,000 tokens decodes for half a minute; the client closes its
connection after a second, and within two the replica runs nothing, counts one abort (and no
success) and holds no block, streamed or not, running or still waiting."""

from __future__ import annotations

import time

import pytest

from tests.support.abandon import Abandoned, assert_aborted, counts, wait_running
from tests.support.cluster import generate
from tests.support.procs import start_replica

pytestmark = pytest.mark.slow

LONG = 20_000  # tokens: ~35 s of decoding at time scale 1
PROMPT = list(range(1000, 1200))  # 200 tokens: 12 full blocks and an 8-token tail


@pytest.fixture(scope="module")
def replica():
    # --max-running 1: a second request waits while the first runs
    proc = start_replica("--max-running", "1", time_scale=1.0, capacity_blocks=4000)
    yield proc
    proc.stop()


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "tell me everything"}], "stream": True}),
    ("/v1/completions", {"prompt": PROMPT, "stream": True, "stream_options": {"include_usage": True}}),
], ids=["chat", "completions"])
def test_a_stream_whose_client_leaves_is_aborted(replica, path, body):
    before = counts(replica.url)
    client = Abandoned(replica.url, path, {**body, "max_tokens": LONG})
    client.read_until(b"data: ")  # decoding: tokens flow
    time.sleep(0.5)
    assert wait_running(replica.url, 1)["pinned_blocks"] > 0
    client.close()
    assert_aborted(replica.url, before)


@pytest.mark.parametrize("path, body", [
    ("/generate", {"token_ids": PROMPT}),
    ("/v1/completions", {"prompt": PROMPT}),
], ids=["generate", "completions"])
def test_a_request_whose_client_leaves_before_the_answer_is_aborted(replica, path, body):
    before = counts(replica.url)
    client = Abandoned(replica.url, path, {**body, "max_tokens": LONG})
    time.sleep(1.0)
    running = wait_running(replica.url, 1)
    assert running["pinned_blocks"] > 0 and running["private_blocks"] > 0  # the prompt and its decode KV
    client.close()
    assert_aborted(replica.url, before)
    # its prompt's full blocks, computed, stay cached (vLLM keeps them evictable): the next request hits them
    status, _, out = generate(replica.url, PROMPT, max_tokens=1)
    assert status == 200 and out["cached_tokens"] == 12 * 16


def test_a_waiting_request_whose_client_leaves_is_aborted_and_the_running_one_goes_on(replica):
    before = counts(replica.url)
    first = Abandoned(replica.url, "/v1/completions", {"prompt": PROMPT, "max_tokens": LONG, "stream": True})
    first.read_until(b"data: ")
    second = Abandoned(replica.url, "/generate", {"token_ids": [7] * 300, "max_tokens": 10})
    wait_running(replica.url, 1, waiting=1)
    second.close()
    after = wait_running(replica.url, 1, waiting=0, timeout=2.0)
    assert after["aborted"] == before["aborted"] + 1 and after["success"] == before["success"]
    first.sock.settimeout(2.0)
    assert first.sock.recv(65536)  # the running one still streams
    first.close()
    assert_aborted(replica.url, before, aborted=2)


def test_a_client_that_stays_gets_its_answer_and_counts_as_a_success(replica):
    before = counts(replica.url)
    status, _, out = generate(replica.url, [3] * 50, max_tokens=20)
    assert status == 200 and out["output_tokens"] == 20
    after = counts(replica.url)
    assert after["success"] == before["success"] + 1 and after["aborted"] == before["aborted"]
