"""Random bodies at every endpoint: never a 5xx, and the replica stays healthy."""

import json

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.procs import http, http_json, start_replica

# Real processes on loopback: an end-to-end test (CI runs it; `-m "not slow"` skips it locally).
pytestmark = pytest.mark.slow

ENDPOINTS = [("POST", "/generate"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions"),
             ("POST", "/admin/policy"), ("POST", "/admin/reset"), ("GET", "/stats"), ("GET", "/kv/events"),
             ("GET", "/health"), ("GET", "/metrics")]

scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70),
                    st.floats(allow_nan=True), st.text(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=6),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=6)),
                      max_leaves=20)
keys = st.sampled_from(["token_ids", "block_hashes", "max_tokens", "input_tokens", "prompt", "messages", "stream",
                        "user", "model", "policy", "params", "stream_options", "output_tokens", "session"])
bodies = st.dictionaries(keys, values, max_size=5)


@pytest.fixture(scope="module")
def replica():
    proc = start_replica(capacity_blocks=32)
    yield proc
    proc.stop()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(endpoint=st.sampled_from(ENDPOINTS), body=st.one_of(bodies, values), as_msgpack=st.booleans(),
       admin=st.booleans(), query=st.sampled_from(["", "?after=abc", "?after=5&limit=0", "?top=-1", "?after=3"]))
def test_no_5xx(replica, endpoint, body, as_msgpack, admin, query):
    method, path = endpoint
    headers = {"Authorization": "Bearer secret"} if admin else {}
    if method == "GET":
        status, _, data = http("GET", replica.url + path + query, headers=headers)
    else:
        if as_msgpack:
            try:
                raw = msgpack.packb(body)
            except (OverflowError, TypeError, ValueError):
                raw = b"\xc1"
            headers["Content-Type"] = "application/msgpack"
        else:
            raw = json.dumps(body, allow_nan=True).encode()
            headers["Content-Type"] = "application/json"
        status, _, data = http(method, replica.url + path, raw=raw, headers=headers)
    assert status < 500, (status, data[:300])
    if status >= 400:
        assert "error" in json.loads(data)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200), ctype=st.sampled_from(["application/json", "application/msgpack", "text/plain"]))
def test_random_bytes(replica, raw, ctype):
    status, _, data = http("POST", replica.url + "/generate", raw=raw, headers={"Content-Type": ctype})
    assert status < 500


def test_still_healthy_after_the_storm(replica):
    status, body = http_json("GET", replica.url + "/health")
    assert status == 200 and body["status"] == "ok"
    status, out = http_json("POST", replica.url + "/generate", {"token_ids": list(range(20)), "max_tokens": 2})
    assert status == 200
