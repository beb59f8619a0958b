"""Reading runs in each format kvemu compare knows, and the comparison, on three requests worked by hand.

Measured, in every format (seconds from the first arrival):
  request 0: arrives 0, first token 0.5, done 2.5, 100 in, 5 out -> TTFT 0.5, E2E 2.5, TPOT (2.5-0.5)/4 = 0.5
  request 1: arrives 1, first token 2.0, done 4.0, 200 in, 3 out -> TTFT 1.0, E2E 3.0, TPOT (4-2)/2 = 1.0
  request 2: arrives 2, first token 4.0, done 4.0, 300 in, 1 out -> TTFT 2.0, E2E 2.0, no TPOT (one token)
Predicted (kvemu's file):
  request 0: first token 0.75, done 3.25 -> TTFT 0.75 (+50%), E2E 3.25 (+30%), TPOT 0.625 (+25%)
  request 1: first token 2.0,  done 3.0  -> TTFT 1.0 (0%),    E2E 2.0 (-1/3),  TPOT 0.5 (-50%)
  request 2: first token 5.0,  done 5.0  -> TTFT 3.0 (+50%),  E2E 3.0 (+50%)
"""

from __future__ import annotations

import json

import pytest

from loadgen.compare import compare, read_run
from shared.errors import KvemuError, TraceFormatError

LENGTHS = [(100, 5), (200, 3), (300, 1)]
MEASURED = [(0.0, 0.5, 2.5), (1.0, 2.0, 4.0), (2.0, 4.0, 4.0)]  # arrival, first token, finish
PREDICTED = [(0.0, 0.75, 3.25), (1.0, 2.0, 3.0), (2.0, 5.0, 5.0)]


def kvemu_lines(times, lengths=LENGTHS) -> str:
    return "".join(json.dumps({"index": i, "arrival_s": a, "first_token_s": f, "finish_s": d, "input_tokens": n,
                               "output_tokens": o, "cached_tokens": 0, "preemptions": 0, "replica": "replica-0"})
                   + "\n" for i, ((a, f, d), (n, o)) in enumerate(zip(times, lengths)))


def llmservingsim_lines(times, base=27536.0) -> str:
    # lines out of order: the index is the request id's number; arrival_time, a wall-clock epoch, is never read
    rows = [json.dumps({"request_id": f"bench-{i}", "input_toks": n, "output_toks": o, "arrival_time": 1.78e9 - i,
                        "queued_ts": base + a, "scheduled_ts": base + a, "first_token_ts": base + f,
                        "last_token_ts": base + d}) for i, ((a, f, d), (n, o)) in enumerate(zip(times, LENGTHS))]
    return "\n".join([rows[1], rows[0], "", rows[2]]) + "\n"


def distserve_text(times, base=12450751.0) -> str:
    # completion order, as DistServe writes it; the summary block after the first line is not read
    items = [{"prompt_len": n, "output_len": o, "issue_time": base + a, "first_token_time": base + f,
              "complete_time": base + d, "ttft_ms": (f - a) * 1e3, "tpot_ms": 0.0, "latency_ms": (d - a) * 1e3}
             for (a, f, d), (n, o) in zip(times, LENGTHS)]
    return repr([items[0], items[2], items[1]]) + "\n{\n\tnum_requests: 3\n}\n"


WRITERS = {"kvemu": (kvemu_lines, "run.jsonl"), "llmservingsim": (llmservingsim_lines, "requests.jsonl"),
           "distserve": (distserve_text, "vllm-3-1.exp")}


def write(tmp_path, fmt, times, name=None):
    writer, default = WRITERS[fmt]
    path = tmp_path / (name or default)
    path.write_text(writer(times))
    return path


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_each_format_reads_to_the_same_requests(tmp_path, fmt):
    run = read_run(write(tmp_path, fmt, MEASURED))
    assert run.format == fmt
    got = [(r.index, r.arrival_s, r.first_token_s, r.finish_s, r.input_tokens, r.output_tokens) for r in run.records]
    assert got == [(i, *t, *n) for i, (t, n) in enumerate(zip(MEASURED, LENGTHS))]


@pytest.mark.parametrize("fmt", list(WRITERS))
def test_comparison_worked_by_hand(tmp_path, fmt):
    cmp = compare(read_run(write(tmp_path, fmt, MEASURED)), read_run(write(tmp_path, "kvemu", PREDICTED, "p.jsonl")))
    f = {k: (v.measured, v.predicted, v.rel_error) for k, v in cmp.figures.items()}
    assert f["ttft_mean_s"] == pytest.approx((3.5 / 3, 4.75 / 3, 4.75 / 3.5 - 1))  # +5/14
    assert f["ttft_p50_s"] == (1.0, 1.0, 0.0)
    assert f["e2e_mean_s"] == pytest.approx((2.5, 2.75, 0.1))
    assert f["e2e_p90_s"] == pytest.approx((2.5 + 0.8 * 0.5, 3.0 + 0.8 * 0.25, 3.2 / 2.9 - 1))
    assert f["tpot_mean_s"] == pytest.approx((0.75, 0.5625, -0.25))
    # ITL mean: every gap after a first token, (2 + 2) / (4 + 2) against (2.5 + 1) / (4 + 2); no percentiles
    assert f["itl_mean_s"] == pytest.approx((4 / 6, 3.5 / 6, -0.125))
    assert f["itl_p50_s"] == (None, None, None)
    assert f["makespan_s"] == pytest.approx((4.0, 5.0, 0.25))
    assert f["throughput_rps"] == pytest.approx((0.75, 0.6, -0.2))
    assert f["output_tokens_per_s"] == pytest.approx((9 / 4, 9 / 5, -0.2))
    e = {k: (v.pairs, v.median, v.p90) for k, v in cmp.per_request.items()}
    assert e["ttft"] == pytest.approx((3, 0.5, 0.5))  # |errors| 0.5, 0, 0.5
    assert e["e2e"] == pytest.approx((3, 1 / 3, 1 / 3 + 0.8 * (0.5 - 1 / 3)))  # 0.3, 1/3, 0.5
    assert e["tpot"] == pytest.approx((2, 0.375, 0.475))  # 0.25, 0.5 (request 2 has one token)


def test_a_run_of_other_requests_is_refused(tmp_path):
    m = read_run(write(tmp_path, "llmservingsim", MEASURED))
    fewer = tmp_path / "fewer.jsonl"
    fewer.write_text(kvemu_lines(PREDICTED[:2]))
    with pytest.raises(KvemuError, match=r"requests\.jsonl has 3 requests and .*fewer\.jsonl 2: compare two runs"):
        compare(m, read_run(fewer))
    longer = tmp_path / "longer.jsonl"
    longer.write_text(kvemu_lines(PREDICTED, [(100, 5), (201, 3), (300, 1)]))
    with pytest.raises(KvemuError, match=r"request 1: input_tokens 200 in .*requests\.jsonl but 201 in .*longer"):
        compare(m, read_run(longer))
    shorter = tmp_path / "shorter.jsonl"
    shorter.write_text(kvemu_lines(PREDICTED, [(100, 5), (200, 3), (300, 2)]))
    with pytest.raises(KvemuError, match=r"request 2: output_tokens 1 in .* but 2 in .*shorter"):
        compare(m, read_run(shorter))


@pytest.mark.parametrize("text, needle", [
    ('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n', "a workload (requests without"),
    ('{"prompt": "hi"}\n', "its first record has prompt"),
    ("[{'prompt_len': 3, 'output_len': 2, 'start_time': 0.0}]\n", "DistServe workload"),
    ("[__import__('os').system('touch PWNED')]\n", "not a Python literal list"),
    ("hello\n", "not JSON lines nor a Python list"),
    ("", "empty"),
])
def test_unknown_formats_name_the_file(tmp_path, monkeypatch, text, needle):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "x.jsonl"
    path.write_text(text)
    with pytest.raises(KvemuError, match="x.jsonl") as exc:
        read_run(path)
    assert needle in str(exc.value)
    assert not (tmp_path / "PWNED").exists()  # a literal is read, never run


def test_bad_fields_name_file_line_and_field(tmp_path):
    path = write(tmp_path, "llmservingsim", [(0.0, 0.5, 2.5), (1.0, 0.5, 4.0), (2.0, 4.0, 4.0)])
    with pytest.raises(TraceFormatError) as exc:
        read_run(path)
    assert (exc.value.line, exc.value.field) == (1, "first_token_ts")  # bench-1 is on line 1
    assert "earlier than queued_ts" in str(exc.value)
    ds = tmp_path / "bad.exp"
    ds.write_text("[{'prompt_len': 3, 'output_len': 'two', 'issue_time': 0.0}]\n")
    with pytest.raises(TraceFormatError, match=r"bad\.exp:1: field '\[0\]\.output_len': must be an integer"):
        read_run(ds)
