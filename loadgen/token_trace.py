"""Token-id request files: LLMServingSim's workloads (casys-kaist/LLMServingSim, ``workloads/*.jsonl``), which
record what a real engine was sent, token for token.

One request a line: ``input_tok_ids`` (the exact prompt), ``output_toks`` (the output length the run was
forced to, ``min_tokens = max_tokens``), ``arrival_time_ns`` (from the run's start), and optionally
``output_tok_ids`` (the tokens generated) and ``input_toks`` (the prompt's length, checked against its ids).

Read as given: arrivals at their times, output lengths pinned, every request a session of its own (the file
names none) whose index is its line among the file's requests, so the lines must be in arrival order. The
prompt is cut into blocks of any size (the trace carries its tokens); where the output's ids are given, the
response's blocks hash from them (``loadgen.trace.response_hashes``), so a later prompt that contains them
hits, as in vLLM.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from loadgen.trace import Trace, TraceRequest
from shared.errors import TraceFormatError
from shared.hashing import DEFAULT_BLOCK_SIZE, block_hashes

FORMAT = "llmservingsim"
_MAX_TOKEN = 2**32  # token ids are hashed as 32-bit unsigned integers (shared.hashing)
_INT_ONLY = {int}


def _ids(path: str, lineno: int, obj: dict, name: str) -> list[int]:
    ids = obj[name]
    if not isinstance(ids, list):
        raise TraceFormatError(path, lineno, name, f"expected a list of token ids, got {ids!r:.60}")
    # one C-speed pass for the common all-valid case; the loop only runs to name the culprit
    if ids and not (set(map(type, ids)) == _INT_ONLY and min(ids) >= 0 and max(ids) < _MAX_TOKEN):
        for i, tok in enumerate(ids):
            if isinstance(tok, bool) or not isinstance(tok, int) or not 0 <= tok < _MAX_TOKEN:
                raise TraceFormatError(path, lineno, f"{name}[{i}]", f"expected a token id in [0, 2**32), got {tok!r:.60}")
    return ids


def _count(path: str, lineno: int, obj: dict, name: str) -> int:
    value = obj[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise TraceFormatError(path, lineno, name, f"expected an integer >= 0, got {value!r:.60}")
    return value


def parse_line(path: str, lineno: int, obj: dict, index: int, block_size: int) -> TraceRequest:
    """One request; a length that disagrees with its ids names the line and both."""
    for name in ("input_tok_ids", "output_toks", "arrival_time_ns"):
        if name not in obj:
            raise TraceFormatError(path, lineno, name, "missing (a token-id request line has input_tok_ids,"
                                                       " output_toks and arrival_time_ns)")
    prompt = _ids(path, lineno, obj, "input_tok_ids")
    n_out = _count(path, lineno, obj, "output_toks")
    if "input_toks" in obj and _count(path, lineno, obj, "input_toks") != len(prompt):
        raise TraceFormatError(path, lineno, "input_toks", f"is {obj['input_toks']} but input_tok_ids holds"
                                                           f" {len(prompt)} ids")
    tokens = prompt
    if obj.get("output_tok_ids") is not None:
        output = _ids(path, lineno, obj, "output_tok_ids")
        if len(output) != n_out:
            raise TraceFormatError(path, lineno, "output_tok_ids", f"holds {len(output)} ids but output_toks is"
                                                                   f" {n_out}")
        tokens = prompt + output
    t_ns = obj["arrival_time_ns"]
    if isinstance(t_ns, bool) or not isinstance(t_ns, int | float) or not 0 <= t_ns < float("inf"):
        raise TraceFormatError(path, lineno, "arrival_time_ns", f"expected nanoseconds >= 0, got {t_ns!r:.60}")
    return TraceRequest(t_ns / 1e9, str(index), 0, block_hashes(prompt, block_size), len(prompt), n_out,
                        token_ids=tokens)


def read_llmservingsim(path: str | Path, lines: Iterable[tuple[int, dict]], block_size: int | None = None) -> Trace:
    """The trace of ``path``, whose (line number, object) pairs are ``lines`` (``loadgen.formats.iter_json_lines``)."""
    p = str(path)
    bs = block_size or DEFAULT_BLOCK_SIZE
    requests: list[TraceRequest] = []
    for lineno, obj in lines:
        r = parse_line(p, lineno, obj, len(requests), bs)
        if requests and r.t < requests[-1].t:
            raise TraceFormatError(p, lineno, "arrival_time_ns", f"{obj['arrival_time_ns']} is before the line"
                                   " above's: a request's index is its line, so put the lines in arrival order")
        requests.append(r)
    if not requests:
        raise TraceFormatError(p, 0, "file", "empty trace: no requests")
    return Trace(requests=requests, block_size=bs, source=p, meta={"tokens": True, "source_format": FORMAT})
