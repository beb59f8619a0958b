"""The per-request file and its summaries, on records worked by hand."""

from __future__ import annotations

import pytest

from loadgen.request_metrics import FIELDS, RequestRecord, read_requests, summarize, write_requests
from shared.errors import TraceFormatError


def _rec(index, arrival, first, finish, out, **kw):
    return RequestRecord(index=index, arrival_s=arrival, first_token_s=first, finish_s=finish, input_tokens=10,
                         output_tokens=out, cached_tokens=kw.get("cached"), preemptions=kw.get("pre"),
                         replica=kw.get("replica"))


def test_round_trip_keeps_every_field_in_order(tmp_path):
    recs = [_rec(0, 0.0, 0.5, 2.5, 5, cached=16, pre=0, replica="replica-0"), _rec(1, 1.0, None, None, 3)]
    path = tmp_path / "r.jsonl"
    assert write_requests(path, recs) == 2
    first = path.read_text().splitlines()[0]
    assert first == ('{"index":0,"arrival_s":0.0,"first_token_s":0.5,"finish_s":2.5,"input_tokens":10,'
                     '"output_tokens":5,"cached_tokens":16,"preemptions":0,"replica":"replica-0"}')
    assert read_requests(path) == recs
    assert FIELDS == ("index", "arrival_s", "first_token_s", "finish_s", "input_tokens", "output_tokens",
                      "cached_tokens", "preemptions", "replica")


def test_summary_by_hand():
    # TTFT 0.5, 1.0, 2.0; E2E 2.5, 3.0, 2.0; TPOT (2.5-0.5)/4 = 0.5, (3-1)/2 = 1.0, none (one token)
    recs = [_rec(0, 0.0, 0.5, 2.5, 5), _rec(1, 1.0, 2.0, 4.0, 3), _rec(2, 2.0, 4.0, 4.0, 1), _rec(3, 3.0, None, None, 9)]
    s = summarize(recs, itl=[0.1, 0.3])
    assert (s["requests"], s["finished"]) == (4, 3)
    assert s["ttft_mean_s"] == pytest.approx(3.5 / 3) and s["ttft_p50_s"] == 1.0
    assert s["ttft_p90_s"] == pytest.approx(1.0 + 0.8 * 1.0)  # linear between ranks 1 and 2
    assert s["e2e_mean_s"] == pytest.approx(2.5) and s["e2e_p99_s"] == pytest.approx(2.5 + 0.98 * 0.5)
    assert s["tpot_mean_s"] == pytest.approx(0.75) and s["tpot_p50_s"] == pytest.approx(0.75)
    assert s["itl_mean_s"] == pytest.approx(0.2) and s["itl_p50_s"] == pytest.approx(0.2)
    assert s["makespan_s"] == 4.0  # first arrival 0 to last finish 4
    assert s["throughput_rps"] == 0.75 and s["output_tokens_per_s"] == 9 / 4
    assert summarize(recs)["itl_mean_s"] is None


@pytest.mark.parametrize("line, field", [
    ('{"index":0}', "arrival_s"),
    ('{"index":0,"arrival_s":0,"first_token_s":null,"finish_s":null,"input_tokens":-1,"output_tokens":1,'
     '"cached_tokens":null,"preemptions":null,"replica":null}', "input_tokens"),
    ('{"index":0,"arrival_s":0,"first_token_s":null,"finish_s":null,"input_tokens":1,"output_tokens":1,'
     '"cached_tokens":null,"preemptions":null,"replica":null,"ttft":1}', "ttft"),
    ('[1]', "line"),
])
def test_bad_lines_name_file_line_and_field(tmp_path, line, field):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n" + line + "\n")
    with pytest.raises(TraceFormatError) as exc:
        read_requests(path)
    assert (exc.value.path, exc.value.line, exc.value.field) == (str(path), 2, field)
