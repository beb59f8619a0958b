"""Session inference: the C twin (loadgen/_traceread.c) against its definition, SessionInferrer."""

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import loadgen.sessions as sessions
from loadgen.formats import read_mooncake, resolve_trace
from loadgen.sessions import SessionInferrer, infer_sessions

needs_c = pytest.mark.skipif(sessions._read is None, reason=f"session inference in C: {sessions.READ_MISSING}")


def defined(lists, tail_blocks=4, min_shared_blocks=2, limit=1 << 20):
    inferrer = SessionInferrer(tail_blocks, min_shared_blocks, limit)
    pairs = [inferrer.assign(ids) for ids in lists]
    return [s for s, _ in pairs], [t for _, t in pairs]


@pytest.mark.skipif(not os.environ.get("KVEMU_REQUIRE_COMPILED"), reason="no C compiler was found by scripts/test")
def test_session_inference_is_built_and_current_where_a_compiler_is():
    assert sessions._read is not None, sessions.READ_MISSING


def test_a_hand_worked_trace():
    lists = [[0, 1, 2], [0, 5], [0, 1, 2, 3, 4], [0, 5, 6], [9, 1, 2], [0, 1, 2, 3, 4, 7]]
    # [0, 5]: only block 0 shared (min_shared_blocks 2): new; [0, 5, 6] matches [0, 5]'s tail at depth 2;
    # [9, 1, 2]: a different first block, the same later ids (not chained here): joins session 0
    assert infer_sessions(lists) == (["0", "1", "0", "1", "0", "0"], [0, 0, 1, 1, 2, 3])
    assert infer_sessions(lists) == defined(lists)


def test_a_bounded_map_forgets_the_oldest_tails():
    lists = [[0, 1, 2], [0, 5, 6], [0, 7, 8], [0, 1, 2, 3]]
    assert infer_sessions(lists, tail_blocks=2, limit=4) == (["0", "1", "2", "3"], [0, 0, 0, 0])
    assert infer_sessions(lists, tail_blocks=2, limit=6) == (["0", "1", "2", "0"], [0, 0, 0, 1])
    assert infer_sessions(lists, tail_blocks=2, limit=0) == (["0", "1", "2", "3"], [0, 0, 0, 0])


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), max_size=9), max_size=60), st.integers(1, 5), st.integers(0, 3),
       st.integers(0, 30))
def test_the_c_twin_gives_the_definitions_sessions(lists, tail_blocks, min_shared_blocks, limit):
    """Small id ranges and limits: matches, re-owned tails, evictions (the table's backward shifts)."""
    assert sessions._read.infer_sessions(lists, tail_blocks, min_shared_blocks, limit) == \
        defined(lists, tail_blocks, min_shared_blocks, limit)


@needs_c
def test_the_c_twin_on_a_long_random_trace_with_large_ids():
    import random

    rng = random.Random(7)
    pool = [rng.getrandbits(64) for _ in range(3000)]
    lists = []
    for _ in range(20_000):
        base = lists[rng.randrange(len(lists))] if lists and rng.random() < 0.6 else []
        lists.append(base[:rng.randint(0, len(base))] + rng.sample(pool, rng.randint(0, 5)))
    for limit in (50, 1000, 1 << 20):
        assert sessions._read.infer_sessions(lists, 4, 2, limit) == defined(lists, 4, 2, limit)


def test_the_builtin_trace_reads_the_definitions_sessions():
    trace = read_mooncake(resolve_trace("mooncake-conversation"))
    got = ([r.session for r in trace.requests], [r.turn for r in trace.requests])
    assert got == defined([r.hash_ids for r in trace.requests]) and len(set(got[0])) == 7_956


def test_ids_the_reader_did_not_check_take_the_definition():
    lists = [[-1, 2, 3], [-1, 2, 3, 4], ["a", "b"]]
    assert infer_sessions(lists) == defined(lists) == (["0", "0", "1"], [0, 1, 0])


@pytest.mark.parametrize("args", [(0, 2, 10), (4, -1, 10), (4, 2, -1)])
def test_settings_outside_the_definitions_range_are_refused(args):
    with pytest.raises(ValueError, match="tail_blocks >= 1"):
        infer_sessions([[1]], *args)
