"""trace_stats: exact counts on hand-made traces and on the published Mooncake traces."""

from __future__ import annotations

import json

import pytest

from loadgen.formats import read_trace
from loadgen.stats import Distribution, trace_stats
from loadgen.trace import Trace, TraceRequest


@pytest.mark.parametrize(
    "name, requests, accesses, distinct, hit",
    [
        ("mooncake-conversation", 12_031, 288_500, 182_790, 0.366),
        ("mooncake-synthetic", 3_993, 121_877, 43_924, 0.640),
    ],
)
def test_published_mooncake_numbers(name, requests, accesses, distinct, hit):
    s = trace_stats(read_trace(name))  # read by built-in name
    assert (s.requests, s.block_accesses, s.distinct_blocks) == (requests, accesses, distinct)
    assert round(s.infinite_cache_block_hit, 3) == hit
    assert s.block_size == 512
    assert s.turns_per_session.count == s.sessions
    assert s.intra_session_gap_s.count == s.requests - s.sessions
    assert s.input_tokens_per_request.count == s.requests
    assert s.kinds == {}


def req(t, session, turn, ids, n_in=100, n_out=10, kind=None):
    return TraceRequest(t, session, turn, ids, n_in, n_out, kind)


SMALL = Trace(
    requests=[
        req(0.0, "a", 0, [1, 2], 30, 5, "multi"),
        req(1.0, "b", 0, [1, 9], 32, 6, "single"),
        req(4.0, "a", 1, [1, 2, 3], 48, 7, "multi"),
        req(10.0, "a", 2, [1, 2, 3, 4], 64, 8, "multi"),
        req(11.0, "c", 0, [5], 16, 9, "agent"),
        req(12.0, "c", 1, [5, 6], 32, 10, "agent"),
    ],
    block_size=16,
    source="small",
)


def test_small_trace_exact():
    s = trace_stats(SMALL)
    assert (s.requests, s.sessions, s.single_turn_sessions) == (6, 3, 1)
    assert s.block_accesses == 2 + 2 + 3 + 4 + 1 + 2
    assert s.distinct_blocks == 7  # 1 2 3 4 5 6 9; footprints a=4, b=2, c=2
    assert s.infinite_cache_block_hit == pytest.approx(1 - 7 / 14)
    assert (s.input_tokens, s.output_tokens, s.duration_s) == (222, 45, 12.0)
    assert s.turns_per_session == Distribution(3, 2.0, 2.0, 2.8, 2.98, 3.0)
    assert s.intra_session_gap_s.count == 3  # a: 4 and 6 s; c: 1 s
    assert (s.intra_session_gap_s.p50, s.intra_session_gap_s.max) == (4.0, 6.0)
    assert s.intra_session_gap_s.mean == pytest.approx(11 / 3)
    assert s.session_footprint_blocks.to_dict() == {"count": 3, "mean": pytest.approx(8 / 3), "p50": 2.0, "p90": 3.6,
                                                    "p99": pytest.approx(3.96), "max": 4.0}
    assert s.input_tokens_per_request.mean == 37.0
    assert {k: (v.requests, v.sessions, v.block_accesses, v.input_tokens) for k, v in s.kinds.items()} == {
        "agent": (2, 1, 3, 48), "multi": (3, 1, 9, 142), "single": (1, 1, 2, 32)}


def test_gaps_follow_time_not_file_order():
    trace = Trace([req(5.0, "a", 1, [1]), req(2.0, "a", 0, [1]), req(9.0, "a", 2, [1])], 16)
    s = trace_stats(trace)
    assert (s.intra_session_gap_s.count, s.intra_session_gap_s.p50, s.intra_session_gap_s.max) == (2, 3.5, 4.0)


def test_empty_and_single_request():
    s = trace_stats(Trace([], 16))
    assert (s.requests, s.block_accesses, s.infinite_cache_block_hit) == (0, 0, 0.0)
    assert s.turns_per_session == Distribution(0, None, None, None, None, None)
    one = trace_stats(Trace([req(3.0, "x", 0, [])], 16))
    assert one.intra_session_gap_s.count == 0 and one.infinite_cache_block_hit == 0.0
    assert one.session_footprint_blocks.max == 0.0


def test_to_dict_is_json():
    d = json.loads(json.dumps(trace_stats(SMALL).to_dict()))
    for key in ("requests", "sessions", "block_accesses", "distinct_blocks", "infinite_cache_block_hit",
                "input_tokens", "output_tokens", "turns_per_session", "intra_session_gap_s",
                "session_footprint_blocks", "input_tokens_per_request", "kinds"):
        assert key in d
    assert d["turns_per_session"]["p90"] == pytest.approx(2.8)
    assert d["kinds"]["multi"]["requests"] == 3


def test_conversation_shape_hand_worked():
    from loadgen.stats import conversation_shape
    from loadgen.trace import Trace, TraceRequest

    # session a: turn 0 of 100 tokens (50 out), turn 1 of 200 (its history 150, 50 new), turn 2 of
    # 400 (history 250, 150 new); session b: one turn of 10 tokens.
    reqs = [TraceRequest(0.0, "a", 0, [], 100, 50), TraceRequest(1.0, "a", 1, [], 200, 50),
            TraceRequest(2.0, "a", 2, [], 400, 10), TraceRequest(0.5, "b", 0, [], 10, 5)]
    shape = conversation_shape(Trace(reqs, block_size=16))
    assert (shape.sessions, shape.turns_median, shape.turns_mean) == (2, 2.0, 2.0)
    ratios = [1.0, 200 / 50, 400 / 150, 1.0]
    assert shape.prompt_over_new_mean == pytest.approx(sum(ratios) / 4)
    assert shape.prompt_over_new_median == pytest.approx((1.0 + 400 / 150) / 2)
    assert shape.history_share_median == pytest.approx((0.0 + 250 / 400) / 2)  # shares 0, 0.75, 0.625, 0
