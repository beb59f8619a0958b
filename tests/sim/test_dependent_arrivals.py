"""``kvemu sim`` with dependent arrivals (loadgen/arrivals.py on the simulated clock): the hand-worked agent trace
the live replay runs too (tests/support/agent_trace.py), each arrival exactly the finish of what it waits for plus
its gap; recorded arrivals keep the trace's times; a refused request's dependents never arrive and count as
failed."""

from __future__ import annotations

import dataclasses

import pytest

from loadgen.arrivals import ARRIVAL_MODES
from shared.costmodel import CostModel, StepWork
from tests.support.agent_trace import AGENT, GPU, MODEL, due, req, simulate_by_hand


def test_each_arrival_is_the_finish_of_what_it_waits_for_plus_its_gap():
    run = simulate_by_hand(AGENT)
    recs = {AGENT[r.index].id: r for r in run["request_records"]}
    assert recs["t1"].arrival_s == 0.0 and recs["p"].arrival_s == 0.2  # waiting for nothing: at their t
    finish = {name: r.finish_s for name, r in recs.items()}
    expected = due(finish)
    assert {name: recs[name].arrival_s for name in expected} == expected  # exactly, on the simulated clock
    # t1 ran alone: its prefill step of 40 tokens, then one decode step over 41
    cost = CostModel.from_names(MODEL, GPU)
    one = cost.step_time(StepWork.of([(40, 0)])) + cost.step_time(StepWork(decoders=1, decode_kv=41))
    assert finish["t1"] == pytest.approx(one, rel=1e-12)
    assert recs["t2"].arrival_s == pytest.approx(one + 1.0, rel=1e-12)
    assert all(r.arrival_s < 9.0 for r in recs.values())  # none waited for its recorded time
    assert run["served"] == 7 and run["dependency_failed"] == 0


def test_recorded_arrivals_keep_the_trace_times():
    run = simulate_by_hand(AGENT, arrivals="recorded")
    assert [r.arrival_s for r in run["request_records"]] == [r.t for r in AGENT]


def test_a_refused_requests_dependents_never_arrive_and_count_as_failed():
    # p's prompt is over max_model_len: refused; c waits for it, j for c; x waits for nothing
    reqs = [dataclasses.replace(req("p", 0.0, 0), input_tokens=600), req("c", 0.0, 1, ["p"]), req("j", 0.0, 2, ["c"]),
            req("x", 0.0, 0, session="x")]
    run = simulate_by_hand(reqs, max_model_len=512)
    assert (run["refused"], run["dependency_failed"], run["served"]) == (1, 2, 1)
    assert [r.finish_s is None for r in run["request_records"]] == [True, True, True, False]
    # recorded: c and j run at their times
    run = simulate_by_hand(reqs, max_model_len=512, arrivals="recorded")
    assert (run["refused"], run["dependency_failed"], run["served"]) == (1, 0, 3)


def test_the_settings_and_the_flag_name_the_same_modes():
    from kvemu.options.arrivals import CHOICES

    assert CHOICES == ARRIVAL_MODES
