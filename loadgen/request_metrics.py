"""Per-request results, the one definition every side uses: ``kvemu sim --requests-out`` and ``kvemu replay
--requests-out`` write them, ``kvemu compare`` reads them, and the summaries of TTFT, TPOT, E2E and ITL are
computed here and nowhere else.

A file holds one JSON object a line with exactly the fields of ``RequestRecord``. Times are seconds from the
run's start (the trace's time 0 in the simulator, the replay's start against a server). A request that never
ran (refused, or failed against a server) has ``first_token_s`` and ``finish_s`` null; what a side cannot
know is null too (a server that reports no cached tokens, no replica, no preemptions).

Definitions, as vLLM's benchmark (``benchmarks/benchmark_serving.py``) gives them:

* TTFT = first_token_s - arrival_s; E2E = finish_s - arrival_s.
* TPOT = (finish_s - first_token_s) / (output_tokens - 1), only for output_tokens > 1.
* ITL: the gaps between a request's successive tokens; a record does not carry them, so a run that saw them
  (a streaming replay, the simulator's steps) passes them to ``summarize``.
* Percentiles are exact, numpy's linear interpolation between the two nearest ranks (``np.percentile``'s
  default, what vLLM's benchmark reports), never histogram buckets.
* makespan = the last finish - the first arrival, over the requests that finished; throughput = finished
  requests and their output tokens per second of it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from shared.errors import InputError, TraceFormatError

PERCENTILES = (50, 90, 99)
METRICS = ("ttft", "tpot", "e2e", "itl")  # the summaries' keys: ttft_mean_s, ttft_p50_s, ...


@dataclass(slots=True)
class RequestRecord:
    index: int  # the request's 0-based line in the trace (its place among the trace's requests)
    arrival_s: float
    first_token_s: float | None
    finish_s: float | None
    input_tokens: int
    output_tokens: int
    cached_tokens: int | None  # prompt tokens served from cache (None: not reported)
    preemptions: int | None  # times the engine preempted it (None: unknown)
    replica: str | None  # the replica that served it (None: unknown)

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """vLLM's TPOT: the time per output token after the first; None for one token or an unfinished request."""
        if self.output_tokens <= 1 or self.first_token_s is None or self.finish_s is None:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)

    def to_json(self) -> dict:
        return {name: getattr(self, name) for name in FIELDS}


FIELDS = tuple(RequestRecord.__dataclass_fields__)  # the file's keys, in order
# (name, the JSON types it takes, whether null is allowed)
_TYPES: dict[str, tuple[tuple[type, ...], bool]] = {
    "index": ((int,), False), "arrival_s": ((int, float), False), "first_token_s": ((int, float), True),
    "finish_s": ((int, float), True), "input_tokens": ((int,), False), "output_tokens": ((int,), False),
    "cached_tokens": ((int,), True), "preemptions": ((int,), True), "replica": ((str,), True),
}


def write_requests(path: str | Path, records: Iterable[RequestRecord]) -> int:
    """``records`` as JSON lines at ``path``, written whole or not at all (a temporary file renamed into
    place); returns how many."""
    p = Path(path)
    tmp = p.with_name(p.name + ".part")
    n = 0
    try:
        with open(tmp, "wb") as fh:
            for rec in records:
                fh.write(orjson.dumps(rec.to_json()) + b"\n")
                n += 1
        tmp.replace(p)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InputError("--requests-out", f"cannot write {p}: {exc.strerror or exc}") from None
    return n


def read_requests(path: str | Path) -> list[RequestRecord]:
    """A file ``write_requests`` wrote; a line with a missing, unknown or mistyped field names the file, the line
    and the field."""
    p = str(path)
    try:
        lines = Path(p).read_bytes().splitlines()
    except OSError as exc:
        raise InputError("requests file", f"cannot read {p}: {exc.strerror or exc}") from None
    out = [parse_record(p, lineno, line) for lineno, line in enumerate(lines, 1) if line.strip()]
    if not out:
        raise TraceFormatError(p, 0, "file", "no requests")
    return out


def object_line(path: str, lineno: int, line: bytes) -> dict:
    """One line of a JSON-lines file as an object, or one line naming the file and line."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(path, lineno, "line", f"malformed JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise TraceFormatError(path, lineno, "line", "expected a JSON object")
    return obj


def parse_record(path: str, lineno: int, line: bytes) -> RequestRecord:
    obj = object_line(path, lineno, line)
    extra = sorted(set(obj) - set(FIELDS))
    if extra:
        raise TraceFormatError(path, lineno, extra[0], f"not a per-request field (they are: {', '.join(FIELDS)})")
    for name, (types, nullable) in _TYPES.items():
        if name not in obj:
            raise TraceFormatError(path, lineno, name, "missing")
        value = obj[name]
        if value is None and nullable:
            continue
        if isinstance(value, bool) or not isinstance(value, types) or (isinstance(value, float) and not math.isfinite(value)):
            kind = "/".join(t.__name__ for t in types) + (" or null" if nullable else "")
            raise TraceFormatError(path, lineno, name, f"expected {kind}, got {value!r:.60}")
        if isinstance(value, int) and name in ("index", "input_tokens", "output_tokens", "cached_tokens",
                                               "preemptions") and value < 0:
            raise TraceFormatError(path, lineno, name, f"must be >= 0, got {value}")
    return RequestRecord(**obj)


def stats(values: Sequence[float] | np.ndarray) -> dict[str, float | None]:
    """mean, p50, p90 and p99 of ``values`` (exact, numpy's linear interpolation); None each where empty."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return {"mean": None, **{f"p{q}": None for q in PERCENTILES}}
    qs = np.percentile(arr, PERCENTILES)
    return {"mean": float(arr.mean()), **{f"p{q}": float(v) for q, v in zip(PERCENTILES, qs)}}


def summarize(records: Sequence[RequestRecord], itl: Sequence[float] | np.ndarray | None = None) -> dict:
    """The run's figures from its requests (``summary_of``); a request that never finished counts in
    ``requests`` only."""
    done = [r for r in records if r.first_token_s is not None and r.finish_s is not None]
    return summary_of(len(records), np.array([r.arrival_s for r in done], dtype=np.float64),
                      np.array([r.first_token_s for r in done], dtype=np.float64),
                      np.array([r.finish_s for r in done], dtype=np.float64),
                      np.array([r.output_tokens for r in done], dtype=np.int64), itl)


def summary_of(requests: int, arrival: np.ndarray, first_token: np.ndarray, finish: np.ndarray,
               output_tokens: np.ndarray, itl: Sequence[float] | np.ndarray | None = None) -> dict:
    """The run's figures from the columns of its finished requests (seconds; one entry a request):
    ``<metric>_<mean|p50|p90|p99>_s`` for TTFT, TPOT, E2E and (where ``itl`` is given) ITL, None where no request
    has it; the makespan and the throughput in requests and output tokens per second. The definitions are the
    module's (its docstring)."""
    many = output_tokens > 1
    series = {"ttft": first_token - arrival, "e2e": finish - arrival,
              "tpot": (finish[many] - first_token[many]) / (output_tokens[many] - 1),
              "itl": np.asarray(itl if itl is not None else (), dtype=np.float64)}
    out: dict = {"requests": requests, "finished": int(finish.size)}
    for name in METRICS:
        for key, value in stats(series[name]).items():
            out[f"{name}_{key}_s"] = value if name != "itl" or itl is not None else None
    span = float(finish.max() - arrival.min()) if finish.size else 0.0
    out["makespan_s"] = span if finish.size else None
    out["throughput_rps"] = finish.size / span if span > 0 else None
    out["output_tokens_per_s"] = int(output_tokens.sum()) / span if span > 0 else None
    return out
