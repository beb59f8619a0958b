"""The router's requests in flight per session (router/session_flights.py): the agent panel's sessions in flight,
those fanned out, and the most requests one session had at once, worked by hand."""

from __future__ import annotations

from contextlib import ExitStack

from router.session_flights import SessionFlights


def test_fan_out_as_the_router_sees_it():
    f = SessionFlights()
    with ExitStack() as outer:
        outer.enter_context(f.flight("a"))  # a's parent turn ... its three children at once
        with ExitStack() as children:
            for _ in range(3):
                children.enter_context(f.flight("a"))
            outer.enter_context(f.flight("b"))
            outer.enter_context(f.flight(None))  # no session: counted for none
            now = f.now(5)
            assert (now.sessions, now.fanned_out, now.requests, now.widest) == (2, 1, 5, 4)
            assert [(s.session, s.in_flight, s.widest) for s in now.top] == [("a", 4, 4), ("b", 1, 1)]
        now = f.now(1, label=str.upper)  # the children answered: a keeps its widest until it has none in flight
        assert (now.sessions, now.fanned_out, now.requests, now.widest) == (2, 0, 2, 4)
        assert [(s.session, s.in_flight, s.widest) for s in now.top] == [("A", 1, 4)]
    assert f.now(5) == (0, 0, 0, 0, [])
    with f.flight("a"):  # a session back after none in flight starts over
        assert f.now(5).widest == 1


def test_a_failed_request_leaves_the_count():
    f = SessionFlights()
    try:
        with f.flight("a"):
            raise RuntimeError("the replica failed")
    except RuntimeError:
        pass
    assert f.now(5).sessions == 0
