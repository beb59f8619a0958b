"""What the OpenAI replay sends as a prompt, and how it reads a stream, worked by hand."""

from __future__ import annotations

from loadgen.openai_replay import END_ID, FIRST_ID, _Stream, prompt_ids
from loadgen.trace import TraceRequest


def test_a_token_id_trace_sends_its_own_prompt():
    r = TraceRequest(0.0, "0", 0, [1], 5, 2, token_ids=[10, 11, 12, 13, 14, 500, 501])
    assert prompt_ids(r, 4) == [10, 11, 12, 13, 14]


def test_prompts_share_tokens_where_they_share_hashed_blocks():
    a = TraceRequest(0.0, "a", 0, [7, 8, 9], 10, 1)  # two full blocks of 4 and 2 tokens of a third id
    b = TraceRequest(1.0, "b", 0, [7, 8, 5], 14, 1)  # the same first two blocks, then its own
    pa, pb = prompt_ids(a, 4), prompt_ids(b, 4)
    assert (len(pa), len(pb)) == (10, 14)  # input_tokens each: a partial last id gives only the prompt's tokens
    assert pa[:8] == pb[:8] and pa[8:10] != pb[8:10]
    assert all(FIRST_ID <= t < END_ID for t in pa + pb)
    assert prompt_ids(a, 4) == pa  # drawn from the hashes: the same every time


def test_a_stream_times_its_first_and_last_choice_and_the_gaps_between():
    s = _Stream()
    s.line(b'data: {"choices":[{"text":"a","finish_reason":null}]}\n', 1.0)
    s.line(b'data: {"choices":[{"text":"b","finish_reason":null}]}\n', 1.5)
    s.line(b'\n', 1.6)
    s.line(b'data: {"choices":[{"text":"","finish_reason":"length"}]}\n', 2.25)
    s.line(b'data: {"choices":[],"usage":{"prompt_tokens":9,"prompt_tokens_details":{"cached_tokens":8}}}\n', 2.5)
    s.line(b'data: [DONE]\n', 2.6)
    assert (s.first, s.last, s.finished, s.gaps) == (1.0, 2.25, True, [0.5, 0.75])
    assert s.usage == {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 8}}
