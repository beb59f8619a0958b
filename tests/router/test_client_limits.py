"""Per-client limits on the router (issue 17): requests in flight and a request rate, each a
429 naming the limit, off by default."""

from __future__ import annotations

import math
import threading

import pytest

from router.limits import ClientLimiter, ClientLimits
from router.settings import RouterSettings
from shared.errors import InputError
from tests.support.cluster import metric, scrape, start_router, stop_all, wait_for
from tests.support.procs import http, http_json, start_replica


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def admitted(lim: ClientLimiter, client: str) -> bool:
    refusal = lim.admit(client)
    if refusal is None:
        lim.release(client)
    return refusal is None


def test_in_flight_limit_refuses_beyond_it_per_client_and_admits_after_a_release():
    lim = ClientLimiter(ClientLimits(max_in_flight=2), Clock())
    assert lim.admit("a") is None and lim.admit("a") is None
    refusal = lim.admit("a")
    assert refusal is not None and refusal.field == "client_max_in_flight"
    assert refusal.message == "this client already has 2 requests in flight; the limit is 2 per client"
    assert lim.admit("b") is None  # another client is not affected
    lim.release("a")
    assert lim.admit("a") is None
    for client in ("a", "a", "b"):
        lim.release(client)
    assert lim.in_flight == {}  # nothing left behind


def test_rate_limit_is_a_token_bucket_worked_by_hand():
    clock = Clock()
    lim = ClientLimiter(ClientLimits(rate=2.0, burst=3), clock)
    assert [admitted(lim, "a") for _ in range(3)] == [True, True, True]  # a full bucket of 3
    refusal = lim.admit("a")  # empty: one token comes back in 1 / 2 s
    assert refusal is not None and refusal.field == "client_rate" and refusal.retry_after_s == 0.5
    assert refusal.message == "this client is over 2 requests/s (bursts of 3); retry in 0.50 s"
    clock.t = 0.25  # half a token
    assert lim.admit("a").retry_after_s == 0.25  # type: ignore[union-attr]
    assert admitted(lim, "b")  # its own bucket
    clock.t = 0.5  # one token
    assert admitted(lim, "a") and not admitted(lim, "a")
    clock.t = 100.0  # refilled, but never beyond the burst
    assert [admitted(lim, "a") for _ in range(4)] == [True, True, True, False]


def test_default_burst_is_the_rate_rounded_up_and_limits_are_off_by_default():
    assert ClientLimits(rate=2.5).bucket_size == 3 and ClientLimits(rate=0.2).bucket_size == 1
    assert ClientLimits(rate=0.2, burst=5).bucket_size == 5
    settings = RouterSettings(replicas=("http://127.0.0.1:9",))
    assert not settings.client_limits().enabled
    assert (settings.client_max_in_flight, settings.client_rate) == (0, 0.0)


@pytest.mark.parametrize("kwargs, field", [
    ({"client_rate": -1.0}, "client_rate"), ({"client_rate": math.nan}, "client_rate"),
    ({"client_rate": math.inf}, "client_rate"), ({"client_max_in_flight": -1}, "client_max_in_flight"),
    ({"client_burst": -2}, "client_burst"),
])
def test_bad_limits_name_the_setting(kwargs, field):
    with pytest.raises(InputError) as err:
        RouterSettings(replicas=("http://127.0.0.1:9",), **kwargs)
    assert err.value.field == field


def test_idle_buckets_are_dropped_so_many_addresses_cannot_grow_the_table():
    clock = Clock()
    lim = ClientLimiter(ClientLimits(rate=1.0, max_clients=4), clock)
    for i, c in enumerate("abcd"):
        clock.t = i * 0.1
        assert admitted(lim, c)  # each bucket (size 1) now empty
    clock.t = 0.5  # a: 0.5 tokens, b 0.4, c 0.3, d 0.2: none idle, so the older half goes
    assert admitted(lim, "e")
    assert sorted(lim.buckets) == ["c", "d", "e"]
    clock.t = 5.0
    assert admitted(lim, "f")  # 4 entries: room for it
    assert admitted(lim, "g")  # full again: c, d and e have refilled (idle) and go; f has just spent its token
    assert sorted(lim.buckets) == ["f", "g"]


# ---- the router process ---------------------------------------------------------------------
@pytest.mark.slow
def test_router_answers_429_naming_each_limit_and_counts_them():
    rep = start_replica(time_scale=1.0)
    inflight = rate = None
    try:
        inflight = start_router([rep.url], "--client-max-in-flight", "1")
        rate = start_router([rep.url], "--client-rate", "0.5", "--client-burst", "2")
        # In flight: a slow request holds the client's one slot; a second one at the same time is refused.
        slow: dict = {}
        t = threading.Thread(target=lambda: slow.update(r=http_json(
            "POST", inflight.url + "/generate", {"token_ids": list(range(64)), "max_tokens": 1200}, timeout=60)))  # ~2 s
        t.start()
        wait_for(lambda: metric(scrape(inflight.url), "kvemu_router_replica_in_flight") == 1, timeout=10,
                 what="the slow request in flight")
        status, headers, body = http("POST", inflight.url + "/generate",
                                     {"token_ids": list(range(64)), "max_tokens": 1})
        assert status == 429 and headers["Retry-After"] == "1"
        assert b'"param":"client_max_in_flight"' in body.replace(b" ", b"")
        assert http_json("GET", inflight.url + "/health")[0] == 200  # monitoring is never limited
        t.join(60)
        assert slow["r"][0] == 200
        assert http_json("POST", inflight.url + "/generate", {"token_ids": [1, 2], "max_tokens": 1})[0] == 200
        assert metric(scrape(inflight.url), "kvemu_router_requests_total", outcome="client_max_in_flight") == 1
        # Rate: a burst of 2, then 0.5 requests/s: the third at once is refused.
        answers = [http_json("POST", rate.url + "/generate", {"token_ids": [i], "max_tokens": 1}) for i in range(3)]
        assert [s for s, _ in answers] == [200, 200, 429]
        assert answers[2][1]["error"]["param"] == "client_rate" and "0.5 requests/s" in answers[2][1]["error"]["message"]
        assert metric(scrape(rate.url), "kvemu_router_requests_total", outcome="client_rate") == 1
    finally:
        stop_all(inflight, rate, rep)
