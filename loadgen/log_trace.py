"""A request log (``loadgen.request_log``: OpenAI chat or completions bodies, one a line) as a trace: every
command that takes ``--trace`` replays what an application sent (``--format openai``, or detected).

Each body is rendered and encoded as the emulated server does, and its prompt cut into blocks (or radix
pages) of the size asked, so the same log runs with ``--matching blocks`` at any ``--block-size`` and with
``--matching radix`` at any ``--page-size`` (the trace carries its tokens: ``meta["tokens"]``). Times are
the log's ``timestamp`` from its first, or, where a line has none, one second after the line before it;
a session's turns are its requests in log order; a request's output is its ``max_tokens`` (kvemu's
responses run to it). Sessions are the log's or inferred (``loadgen.request_log`` says how).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from loadgen.request_log import iter_request_log
from loadgen.trace import Trace, TraceRequest
from shared.errors import InputError, TraceFormatError
from shared.gc_tuning import gc_paused
from shared.hashing import DEFAULT_BLOCK_SIZE, block_hashes


@contextmanager
def _empty_is_a_format_error(path: str | Path) -> Iterator[None]:
    """An empty log is an empty trace, as every reader says it (``TraceFormatError`` on the file)."""
    try:
        yield
    except InputError as exc:
        if exc.field != "log":
            raise
        raise TraceFormatError(str(path), 0, "file", "empty trace: no requests") from None


def read_openai_log(path: str | Path, block_size: int | None = None) -> Trace:
    bs = block_size or DEFAULT_BLOCK_SIZE
    requests: list[TraceRequest] = []
    turns: dict[str, int] = {}
    t0: float | None = None
    last = 0.0
    with gc_paused(), _empty_is_a_format_error(path):
        for logged in iter_request_log(path):
            if logged.timestamp is None:
                t = last + 1.0 if requests else 0.0
            else:
                t0 = logged.timestamp if t0 is None else t0
                t = logged.timestamp - t0
            last = t
            turn = turns.get(logged.session, 0)
            turns[logged.session] = turn + 1
            requests.append(TraceRequest(t, logged.session, turn, block_hashes(logged.tokens, bs),
                                         len(logged.tokens), logged.max_tokens))
    requests.sort(key=lambda r: r.t)  # stable: a log's order breaks ties
    offset = requests[0].t if requests else 0.0
    if offset < 0:  # lines without a timestamp counted before the first that has one
        for r in requests:
            r.t -= offset
    return Trace(requests=requests, block_size=bs, source=str(path), meta={"tokens": True, "format": "openai"})
