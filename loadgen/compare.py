"""Two runs of the same requests side by side: a measured one (a real engine) and a predicted one (kvemu, or
another simulator), read from any of the per-request formats below, recognised by their content.

* kvemu's per-request file (``--requests-out`` of ``kvemu sim`` and ``kvemu replay``; ``request_metrics``).
* LLMServingSim's ``requests.jsonl``: ``request_id`` "bench-K" is line K of the workload; monotonic
  ``queued_ts``, ``first_token_ts``, ``last_token_ts`` (its ``arrival_time`` is a wall-clock epoch, on
  another clock, and is never used).
* DistServe's ``.exp`` file: its first line a Python literal list of per-request dicts (``prompt_len``,
  ``output_len``, ``issue_time``, ``first_token_time``, ``complete_time``), read with ``ast.literal_eval``.
  The list is in completion order; a request's index is its rank by ``issue_time``, which is its place in
  the workload (DistServe issues the workload's requests in order).

Requests are matched by index; every figure comes from ``request_metrics.summarize``, so TTFT, TPOT and E2E
mean the same thing on both sides. ITL: none of these files carries per-token times, so ITL's percentiles
are unknown; its mean is not, being the mean of every gap between successive tokens, that is the sum over
requests of (finish - first token) over the sum of (output tokens - 1) (vLLM's benchmark's mean ITL).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from loadgen.request_metrics import PERCENTILES, RequestRecord, object_line, read_requests, summarize
from shared.errors import InputError, KvemuError, TraceFormatError
from shared.validate import check_int, check_number

FORMATS = {"kvemu": "kvemu per-request file", "llmservingsim": "LLMServingSim requests.jsonl",
           "distserve": "DistServe .exp"}
METRICS = ("ttft", "tpot", "itl", "e2e")  # in the order a table gives them
STATS = ("mean",) + tuple(f"p{q}" for q in PERCENTILES)
RUN_FIGURES = ("makespan_s", "throughput_rps", "output_tokens_per_s")
PER_REQUEST = ("ttft", "tpot", "e2e")  # the metrics each request has on both sides
ITL_NOTE = ("no per-token times in these files: ITL mean is the mean gap between successive tokens over every "
            "request, sum(finish - first token) / sum(output tokens - 1); its percentiles need per-token times")
_KNOWN = ("kvemu's --requests-out file, LLMServingSim's requests.jsonl or DistServe's measured .exp")


@dataclass(slots=True, frozen=True)
class Run:
    path: str
    format: str  # a key of FORMATS
    records: list[RequestRecord]  # sorted by index, each index once


@dataclass(slots=True, frozen=True)
class Figure:
    measured: float | None
    predicted: float | None

    @property
    def rel_error(self) -> float | None:
        """(predicted - measured) / measured; None where either is missing or measured is 0."""
        if self.measured is None or self.predicted is None or self.measured == 0:
            return None
        return (self.predicted - self.measured) / self.measured


@dataclass(slots=True, frozen=True)
class RequestErrors:
    """|relative error| of one metric, request by request, over the requests both runs have it for."""
    pairs: int
    median: float | None
    p90: float | None


@dataclass(slots=True, frozen=True)
class Comparison:
    measured: Run
    predicted: Run
    figures: dict[str, Figure]  # summarize's keys (ttft_mean_s, ..., makespan_s, throughput_rps, ...)
    per_request: dict[str, RequestErrors]  # by PER_REQUEST metric

    def to_dict(self) -> dict:
        def side(run: Run) -> dict:
            done = sum(r.finish_s is not None for r in run.records)
            return {"file": run.path, "format": run.format, "requests": len(run.records), "finished": done}
        return {
            "measured": side(self.measured), "predicted": side(self.predicted),
            "figures": {k: {"measured": f.measured, "predicted": f.predicted, "rel_error": f.rel_error}
                        for k, f in self.figures.items()},
            "per_request_abs_rel_error": {k: {"pairs": e.pairs, "median": e.median, "p90": e.p90}
                                          for k, e in self.per_request.items()},
            "notes": {"itl": ITL_NOTE, "rel_error": "(predicted - measured) / measured"},
        }


# ---- reading ---------------------------------------------------------------------------------------------

def read_run(path: str | Path) -> Run:
    """The requests of a run's per-request file in any known format, by index; one line naming the file
    and the problem for anything else."""
    p = str(path)
    try:
        data = Path(p).read_bytes()
    except OSError as exc:
        raise KvemuError(f"cannot read {p}: {exc.strerror or exc}") from None
    head = data.lstrip()[:1]
    if head == b"[":
        fmt, records = "distserve", _read_distserve(p, data)
    elif head == b"{":
        fmt = _json_lines_format(p, data)
        records = read_requests(p) if fmt == "kvemu" else _read_llmservingsim(p, data)
    else:
        raise KvemuError(f"{p}: {'empty' if not head else 'not JSON lines nor a Python list'}; "
                         f"kvemu compare reads {_KNOWN}")
    records.sort(key=lambda r: r.index)
    for a, b in zip(records, records[1:]):
        if a.index == b.index:
            raise KvemuError(f"{p}: request index {a.index} appears twice; give one run's results")
    return Run(p, fmt, records)


def _json_lines_format(path: str, data: bytes) -> str:
    line = next(ln for ln in data.splitlines() if ln.strip())
    try:
        first = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(path, _first_line(data), "line", f"malformed JSON ({exc})") from None
    keys = set(first) if isinstance(first, dict) else set()
    if {"index", "arrival_s"} <= keys:
        return "kvemu"
    if {"request_id", "queued_ts"} <= keys:
        return "llmservingsim"
    what = ("a workload (requests without timings), not a run's results"
            if keys & {"arrival_time_ns", "input_tok_ids", "hash_ids", "timestamp"}
            else f"its first record has {', '.join(sorted(keys)[:8]) or 'no fields'}")
    raise KvemuError(f"{path}: not a format kvemu compare reads ({what}); give {_KNOWN}")


def _first_line(data: bytes) -> int:
    return next(i for i, ln in enumerate(data.splitlines(), 1) if ln.strip())


def _number(path: str, line: int, obj: dict, name: str, where: str = "", *, integer: bool = False,
            minimum: float | None = None, nullable: bool = False) -> float | None:
    """``obj[name]`` checked (an integer, or a finite number), naming the file, line and field if it is not."""
    field = f"{where}{name}"
    if name not in obj:
        raise TraceFormatError(path, line, field, "missing")
    value = obj[name]
    if value is None and nullable:
        return None
    try:
        return check_int(field, value, int(minimum) if minimum is not None else None) if integer \
            else check_number(field, value, minimum)
    except InputError as exc:
        raise TraceFormatError(path, line, field, exc.message) from None


def _record(path: str, line: int, index: int, lengths: tuple[int, int], times: tuple[float, float | None,
            float | None], names: tuple[str, str, str], where: str = "") -> RequestRecord:
    """A foreign request as a RequestRecord, its times in order (``names``: the file's names for them)."""
    arrival, first, finish = times
    if first is not None and first < arrival:
        raise TraceFormatError(path, line, where + names[1], f"earlier than {names[0]}")
    if finish is not None and first is not None and finish < first:
        raise TraceFormatError(path, line, where + names[2], f"earlier than {names[1]}")
    return RequestRecord(index=index, arrival_s=arrival, first_token_s=first, finish_s=finish,
                         input_tokens=lengths[0], output_tokens=lengths[1], cached_tokens=None,
                         preemptions=None, replica=None)


_LSS_TIMES = ("queued_ts", "first_token_ts", "last_token_ts")


def _read_llmservingsim(path: str, data: bytes) -> list[RequestRecord]:
    out = []
    for line, text in enumerate(data.splitlines(), 1):
        if not text.strip():
            continue
        obj = object_line(path, line, text)
        rid = obj.get("request_id")
        found = re.search(r"(\d+)$", rid) if isinstance(rid, str) else None
        if found is None:
            raise TraceFormatError(path, line, "request_id", f"expected an id ending in the request's line in "
                                   f"the workload (bench-K), got {rid!r:.60}")
        lengths = (int(_number(path, line, obj, "input_toks", integer=True, minimum=0) or 0),
                   int(_number(path, line, obj, "output_toks", integer=True, minimum=0) or 0))
        arrival = _number(path, line, obj, "queued_ts")
        first, last = (_number(path, line, obj, n, nullable=True) for n in _LSS_TIMES[1:])
        out.append(_record(path, line, int(found.group(1)), lengths, (arrival or 0.0, first, last), _LSS_TIMES))
    return _from_zero(out)


_DS_TIMES = ("issue_time", "first_token_time", "complete_time")


def _read_distserve(path: str, data: bytes) -> list[RequestRecord]:
    first_line = data.lstrip().split(b"\n", 1)[0]
    try:
        items = ast.literal_eval(first_line.decode())  # a literal, never code: never eval
    except (ValueError, SyntaxError, TypeError, UnicodeDecodeError, RecursionError, MemoryError):
        raise KvemuError(f"{path}: its first line is not a Python literal list of requests (DistServe's .exp)"
                         f"; kvemu compare reads {_KNOWN}") from None
    if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
        raise KvemuError(f"{path}: expected a list of per-request dicts on its first line (DistServe's .exp)")
    if "issue_time" not in items[0] and "start_time" in items[0]:
        raise KvemuError(f"{path}: a DistServe workload (requests without timings), not a run's results; "
                         "give its measured .exp")
    line = _first_line(data)
    rows = []
    for i, item in enumerate(items):
        where = f"[{i}]."
        lengths = (int(_number(path, line, item, "prompt_len", where, integer=True, minimum=0) or 0),
                   int(_number(path, line, item, "output_len", where, integer=True, minimum=0) or 0))
        times = tuple(_number(path, line, item, n, where, nullable=n != "issue_time") for n in _DS_TIMES)
        rows.append((times[0] or 0.0, i, lengths, times, where))
    rows.sort(key=lambda row: (row[0], row[1]))  # completion order -> issue order, the workload's
    out = [_record(path, line, index, lengths, (arrival, first, done), _DS_TIMES, where)
           for index, (arrival, _, lengths, (_, first, done), where) in enumerate(rows)]
    return _from_zero(out)


def _from_zero(records: list[RequestRecord]) -> list[RequestRecord]:
    """Times from the first arrival (a monotonic clock's origin means nothing), as kvemu's files have them."""
    t0 = min((r.arrival_s for r in records), default=0.0)
    for r in records:
        r.arrival_s -= t0
        r.first_token_s = None if r.first_token_s is None else r.first_token_s - t0
        r.finish_s = None if r.finish_s is None else r.finish_s - t0
    return records


# ---- matching and comparing ------------------------------------------------------------------------------

def check_same_requests(measured: Run, predicted: Run) -> None:
    """Both runs served the same requests: the same indices, and the same lengths at each."""
    m, p = measured, predicted
    if len(m.records) != len(p.records):
        raise KvemuError(f"{m.path} has {len(m.records):,} requests and {p.path} {len(p.records):,}: "
                         "compare two runs of the same requests")
    for a, b in zip(m.records, p.records):
        if a.index != b.index:
            lo, holder, other = (a, m, p) if a.index < b.index else (b, p, m)
            raise KvemuError(f"request {lo.index} is in {holder.path} but not in {other.path}: "
                             "compare two runs of the same requests")
        done = a.finish_s is not None and b.finish_s is not None
        for name in ("input_tokens", "output_tokens") if done else ("input_tokens",):
            x, y = getattr(a, name), getattr(b, name)
            if x != y:
                raise KvemuError(f"request {a.index}: {name} {x:,} in {m.path} but {y:,} in {p.path}: "
                                 "compare two runs of the same requests")


def itl_mean_s(records: list[RequestRecord]) -> float | None:
    """The mean gap between successive tokens over every request: exact without per-token times, since a
    request's gaps add up to finish - first token."""
    spans = [(r.finish_s - r.first_token_s, r.output_tokens - 1) for r in records
             if r.finish_s is not None and r.first_token_s is not None and r.output_tokens > 1]
    gaps = sum(n for _, n in spans)
    return sum(s for s, _ in spans) / gaps if gaps else None


def _request_errors(m: list[float | None], p: list[float | None]) -> RequestErrors:
    errs = np.array([abs(y - x) / x for x, y in zip(m, p) if x is not None and y is not None and x > 0])
    if errs.size == 0:
        return RequestErrors(0, None, None)
    med, p90 = np.percentile(errs, [50, 90])
    return RequestErrors(int(errs.size), float(med), float(p90))


def compare(measured: Run, predicted: Run) -> Comparison:
    """Every figure of both runs, side by side, and the per-request errors; refuses runs of other requests."""
    check_same_requests(measured, predicted)
    sm, sp = summarize(measured.records), summarize(predicted.records)
    sm["itl_mean_s"], sp["itl_mean_s"] = itl_mean_s(measured.records), itl_mean_s(predicted.records)
    keys = [f"{name}_{stat}_s" for name in METRICS for stat in STATS] + list(RUN_FIGURES)
    figures = {k: Figure(sm[k], sp[k]) for k in keys}
    per_request = {name: _request_errors([getattr(r, f"{name}_s") for r in measured.records],
                                         [getattr(r, f"{name}_s") for r in predicted.records])
                   for name in PER_REQUEST}
    return Comparison(measured, predicted, figures, per_request)
