"""bench/distserve_trace.py: DistServe's workload (lengths and start times) as a kvemu trace, request k on
line k, blocks of each request its own; bad input one line."""

import json

import pytest

from bench.distserve_trace import main, read_workload
from loadgen.formats import read_trace
from shared.errors import KvemuError


def test_the_workload_becomes_a_trace_in_its_order(tmp_path):
    src = tmp_path / "w.exp"
    src.write_text(json.dumps([{"prompt_len": 40, "output_len": 3, "start_time": 0.0},
                               {"prompt_len": 40, "output_len": 5, "start_time": 0.5},
                               {"prompt_len": 15, "output_len": 1, "start_time": 1.25}]))
    out = tmp_path / "t.jsonl"
    assert main([str(src), "-o", str(out), "--time-scale", "2"]) == 0
    trace = read_trace(out)
    assert [(r.t, r.input_tokens, r.output_tokens, len(r.hash_ids)) for r in trace.requests] == \
        [(0.0, 40, 3, 2), (1.0, 40, 5, 2), (2.5, 15, 1, 0)]  # full 16-token blocks only; arrivals x 2
    first, second = trace.requests[0].hash_ids, trace.requests[1].hash_ids
    assert not set(first) & set(second)  # same lengths, no shared block


@pytest.mark.parametrize("body, message", [
    ("[]", "expected a list of requests"),
    ('[{"prompt_len": 0, "output_len": 1, "start_time": 0}]', "request 0: prompt_len must be an integer >= 1, got 0"),
    ('[{"prompt_len": 4, "output_len": 1, "start_time": -1}]', "request 0: start_time must be a number >= 0, got -1"),
    ("{not json", "not JSON"),
])
def test_bad_input_is_one_line_naming_the_file(tmp_path, body, message):
    src = tmp_path / "w.exp"
    src.write_text(body)
    with pytest.raises(KvemuError, match=message):
        read_workload(str(src))
