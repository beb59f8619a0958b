"""Dependent arrivals, hand-worked: a request arrives at max(finish of its ``after``) + ``gap_s``, with no
``after`` at its recorded ``t``; recorded arrivals keep every ``t``; sessions without dependencies chain turn
after turn (``kvemu replay``, ``kvemu sim --causal``); a failed request's dependents never arrive."""

from __future__ import annotations

from loadgen.arrivals import INF, Arrivals
from loadgen.trace import TraceRequest


def req(name, t, session="agent", turn=0, after=(), gap=0.0):
    return TraceRequest(t, session, turn, [turn], 16, 1, id=name, after=tuple(after), gap_s=gap)


TWO_TURNS = [req("t1", 0.0), req("t2", 5.0, turn=1, after=["t1"], gap=1.0)]
# a parent fans out to three children; a fourth request joins them
FAN = [req("p", 0.0), req("c1", 2.0, turn=1, after=["p"], gap=0.5), req("c2", 2.0, turn=1, after=["p"]),
       req("c3", 2.0, turn=1, after=["p"], gap=0.25), req("j", 9.0, turn=2, after=["c1", "c2", "c3"], gap=2.0)]


def test_turn_two_arrives_a_gap_after_turn_one_finishes():
    arrivals = Arrivals(TWO_TURNS)
    assert arrivals.pop() == (0.0, 0)
    assert arrivals.peek() == INF  # turn 2 waits for turn 1, whatever its recorded 5.0
    arrivals.finished(0, 3.5)
    assert arrivals.pop() == (4.5, 1)


def test_a_fan_out_of_three_joined_by_a_fourth():
    arrivals = Arrivals(FAN)
    assert arrivals.pop() == (0.0, 0)
    arrivals.finished(0, 1.0)
    assert [arrivals.pop() for _ in range(3)] == [(1.0, 2), (1.25, 3), (1.5, 1)]  # the children at once
    arrivals.finished(3, 3.0)
    arrivals.finished(1, 2.5)
    assert arrivals.peek() == INF  # the join waits for its last child
    arrivals.finished(2, 4.0)
    assert arrivals.pop() == (6.0, 4)  # the latest child's finish, 4.0, plus 2.0
    assert arrivals.peek() == INF


def test_recorded_arrivals_keep_every_time():
    arrivals = Arrivals(FAN, dependent=False)
    assert [arrivals.pop() for _ in range(5)] == [(0.0, 0), (2.0, 1), (2.0, 2), (2.0, 3), (9.0, 4)]


def test_a_session_without_dependencies_chains_its_turns_by_their_recorded_gaps():
    chat = [req(None, 0.0, "chat", 0), req(None, 2.0, "chat", 1), req(None, 5.0, "chat", 2)]
    arrivals = Arrivals(chat + TWO_TURNS, chain_sessions=True)
    assert [arrivals.pop() for _ in range(2)] == [(0.0, 0), (0.0, 3)]
    arrivals.finished(0, 3.0)
    assert arrivals.pop() == (5.0, 1)  # 3.0 + (2.0 - 0.0)
    arrivals.finished(1, 6.0)
    assert arrivals.pop() == (9.0, 2)  # 6.0 + (5.0 - 2.0)
    unchained = Arrivals(chat)  # each turn at its recorded time
    assert [unchained.pop() for _ in range(3)] == [(0.0, 0), (2.0, 1), (5.0, 2)]


def test_a_failed_request_loses_its_dependents_and_a_chained_turn_still_arrives():
    arrivals = Arrivals(FAN)
    arrivals.pop()
    assert arrivals.failed(0, 1.0) == [1, 2, 3, 4]  # the children, then the join (each once)
    assert arrivals.peek() == INF
    chat = [req(None, 0.0, "chat", 0), req(None, 2.0, "chat", 1)]
    chained = Arrivals(chat, chain_sessions=True)
    chained.pop()
    assert chained.failed(0, 1.0) == []
    assert chained.pop() == (3.0, 1)


def test_a_join_whose_child_failed_never_arrives():
    arrivals = Arrivals(FAN)
    arrivals.pop()
    arrivals.finished(0, 1.0)
    for _ in range(3):
        arrivals.pop()
    assert arrivals.failed(1, 2.0) == [4]  # c1 failed: the join is lost, its siblings run on
    arrivals.finished(2, 3.0)
    arrivals.finished(3, 3.0)
    assert arrivals.peek() == INF


def test_a_wait_on_a_request_outside_the_run_is_not_waited_for():
    arrivals = Arrivals(TWO_TURNS[1:])  # turn 1 cut off (--max-requests): turn 2 at its recorded time
    assert arrivals.pop() == (5.0, 0)
