"""Token-id request files (LLMServingSim's workloads) read by detection, on a five-line sample worked by hand."""

from __future__ import annotations

import json

import pytest

from loadgen.formats import detect_format, read_trace
from loadgen.trace import response_hashes
from shared.errors import TraceFormatError
from shared.hashing import ROOT_HASH, block_hashes

P0 = list(range(100, 120))  # 20 tokens: five blocks of 4
O0 = list(range(500, 506))  # its 6 output tokens: with the prompt, 26 tokens, six full blocks
P1 = P0 + O0 + [7, 8, 9, 10]  # the next prompt contains request 0's prompt and output, then 4 tokens


def sample_lines() -> list[dict]:
    return [
        {"input_toks": 20, "output_toks": 6, "arrival_time_ns": 0, "input_tok_ids": P0, "output_tok_ids": O0},
        {"input_toks": 30, "output_toks": 3, "arrival_time_ns": 10_000_000_000, "input_tok_ids": P1,
         "output_tok_ids": [1, 2, 3]},
        {"output_toks": 1, "arrival_time_ns": 20_000_000_000, "input_tok_ids": list(range(200, 217))},
        {"input_toks": 70, "output_toks": 2, "arrival_time_ns": 30_000_000_000, "input_tok_ids": list(range(300, 370))},
        {"input_toks": 8, "output_toks": 2, "arrival_time_ns": 30_000_000_000, "input_tok_ids": P0[:8]},
    ]


def write_lines(path, lines: list[dict]) -> str:
    path.write_text("".join(json.dumps(obj) + "\n" for obj in lines))
    return str(path)


def test_sample_read_by_detection_with_hand_worked_hashes(tmp_path):
    path = write_lines(tmp_path / "w.jsonl", sample_lines())
    assert detect_format(path) == "llmservingsim"
    trace = read_trace(path, block_size=4)
    assert trace.block_size == 4 and trace.meta["tokens"] is True
    reqs = trace.requests
    assert [r.t for r in reqs] == [0.0, 10.0, 20.0, 30.0, 30.0]
    assert [(r.input_tokens, r.output_tokens) for r in reqs] == [(20, 6), (30, 3), (17, 1), (70, 2), (8, 2)]
    assert [r.session for r in reqs] == ["0", "1", "2", "3", "4"] and {r.turn for r in reqs} == {0}
    # blocks of 4 tokens, chained from the root: h1 = H(root, 100..103), h2 = H(h1, 104..107), ...
    h = ROOT_HASH
    by_hand = []
    for i in range(5):
        h = block_hashes(P0[4 * i:4 * i + 4], 4, h)[0]
        by_hand.append(h)
    assert reqs[0].hash_ids == by_hand
    assert [len(r.hash_ids) for r in reqs] == [5, 7, 4, 17, 2]  # full blocks only: 30 // 4 = 7, 17 // 4 = 4
    assert reqs[1].hash_ids[:5] == by_hand and reqs[4].hash_ids == by_hand[:2]
    assert reqs[0].token_ids == P0 + O0 and reqs[2].token_ids == list(range(200, 217))


def test_response_blocks_hash_from_the_output_ids(tmp_path):
    trace = read_trace(write_lines(tmp_path / "w.jsonl", sample_lines()), block_size=4)
    responses = response_hashes(trace)
    # request 0: 26 tokens make 6 full blocks, its prompt 5: one response block, tokens 500..503 after its prompt,
    # which is request 1's sixth prompt block (the later prompt that contains the output hits it)
    assert responses[0] == block_hashes(P0 + O0[:4], 4)[5:] == [trace.requests[1].hash_ids[5]]
    # request 1: 33 tokens, 8 blocks, its prompt 7: one, from its own output ids [1, 2, 3] after token 10
    assert responses[1] == block_hashes(P1 + [1, 2, 3], 4)[7:]
    assert responses[2] == []  # 17 + 1 tokens: no block beyond the prompt's 4
    # without output ids the response's block is its own, which no later prompt shares
    lines = sample_lines()
    del lines[0]["output_tok_ids"]
    plain = read_trace(write_lines(tmp_path / "plain.jsonl", lines), block_size=4)
    assert len(response_hashes(plain)[0]) == 1 and response_hashes(plain)[0][0] not in plain.requests[1].hash_ids


@pytest.mark.parametrize("change, field, line", [
    ({"input_toks": 21}, "input_toks", 1),
    ({"output_tok_ids": [1, 2]}, "output_tok_ids", 1),
    ({"input_tok_ids": [1, -2]}, "input_tok_ids[1]", 1),
    ({"arrival_time_ns": "soon"}, "arrival_time_ns", 1),
    ({"output_toks": None}, "output_toks", 1),
])
def test_a_line_that_disagrees_names_file_line_and_field(tmp_path, change, field, line):
    lines = sample_lines()
    lines[0].update(change)
    path = write_lines(tmp_path / "bad.jsonl", lines)
    with pytest.raises(TraceFormatError) as exc:
        read_trace(path)
    assert (exc.value.path, exc.value.line, exc.value.field) == (path, line, field)


def test_lines_out_of_arrival_order_and_unknown_formats_are_refused(tmp_path):
    lines = sample_lines()
    lines[1]["arrival_time_ns"] = 5
    lines[2]["arrival_time_ns"] = 1  # line 3 arrives before line 2
    path = write_lines(tmp_path / "order.jsonl", lines)
    with pytest.raises(TraceFormatError, match=r"order\.jsonl:3: field 'arrival_time_ns': 1 is before"):
        read_trace(path)
    unknown = write_lines(tmp_path / "unknown.jsonl", [{"tokens": [1, 2], "when": 0}])
    with pytest.raises(TraceFormatError, match=r"unknown\.jsonl:1: field 'line': cannot tell the trace format"):
        read_trace(unknown)
    missing = write_lines(tmp_path / "missing.jsonl", [{"input_tok_ids": [1, 2], "arrival_time_ns": 0}])
    with pytest.raises(TraceFormatError, match=r"missing\.jsonl:1: field 'output_toks': missing"):
        read_trace(missing)
