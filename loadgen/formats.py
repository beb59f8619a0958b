"""Trace file formats: kvemu JSONL (read and write), Mooncake and Qwen-Bailian (read).

kvemu JSONL: an optional first line ``{"kvemu_trace": 1, "block_size": 16, ...}`` (metadata),
then one request per line with ``t``, ``session``, ``turn``, ``hash_ids``,
``input_tokens``, ``output_tokens`` and optional ``kind``; an agent's requests may carry ``id``, ``after`` (the ids
they wait for) and ``gap_s`` (tool or think time after the last of them finishes): ``loadgen.dependencies``.

Mooncake (kvcache-ai/Mooncake FAST'25 traces): ``timestamp`` (ms), ``input_length``,
``output_length``, ``hash_ids`` of 512-token blocks, already prefix-chained, including an id
for the partial last block.  There are no session ids; ``loadgen.sessions`` infers them.

Qwen-Bailian (alibaba-edu/qwen-bailian-usagetraces-anon): ``chat_id``, ``parent_chat_id``
(-1 for a root), ``timestamp`` (s), ``input_length``, ``output_length``, ``type``, ``turn``,
``hash_ids`` = one salted SipHash id per 16-token block of the whole prompt, NOT chained.

Two agent formats carry dependencies (``after``, ``gap_s``): ``agentic-mooncake`` (Dynamo's agentic Mooncake
rows, ``wait_for`` and ``tool_wait_ms``: ``loadgen.agentic_mooncake``) and ``cc-traces`` (SemiAnalysis's Claude Code
traces, a session a line with its subagents: ``loadgen.cc_traces``).

Two formats carry token ids, not hashes, and are cut into blocks of any size: ``openai`` (request logs,
``loadgen.log_trace``) and ``llmservingsim`` (``input_tok_ids``, ``output_toks``, ``arrival_time_ns``,
optional ``output_tok_ids``: ``loadgen.token_trace``).
"""

from __future__ import annotations

import gzip
import operator
from collections.abc import Iterator
from importlib.resources import files
from itertools import islice
from pathlib import Path

import orjson

from loadgen import trace_cache
from loadgen.dependencies import check_dependencies, dependency_fields, refuse_other_formats
from loadgen.fields import field as _field
from loadgen.fields import hash_list as _hash_list
from loadgen.jsonlines import json_lines, typed_columns
from loadgen.sessions import MIN_SHARED_BLOCKS, TAIL_BLOCKS, infer_sessions
from loadgen.trace import HASHES_U64, Trace, TraceRequest, shared_prefix
from shared.errors import InputError, TraceFormatError, UnknownNameError
from shared.gc_tuning import gc_paused
from shared.hashing import ROOT_HASH, chain_ids

KVEMU_DEFAULT_BLOCK_SIZE = 16
MOONCAKE_BLOCK_SIZE = 512
BAILIAN_BLOCK_SIZE = 16
FORMATS = ("kvemu", "mooncake", "bailian", "openai", "llmservingsim", "agentic-mooncake", "cc-traces")
# formats that carry tokens, not hashes: cut into blocks of any size on read
TOKEN_FORMATS = ("openai", "llmservingsim")
_KINDS = (None, "single", "multi", "agent")
_BAILIAN_ROOTS = (-1, None, "-1", "")

# Traces shipped inside the package (loadgen/data, see its README for their source and licence),
# usable by name wherever a trace file is: `kvemu sim --trace mooncake-conversation`.
BUILTIN_TRACES = {
    "mooncake-conversation": "mooncake_conversation_trace.jsonl.gz",
    "mooncake-synthetic": "mooncake_synthetic_trace.jsonl.gz",
}


def resolve_trace(path: str | Path) -> str:
    """The file behind ``path``: a built-in trace's name maps to its file in the package."""
    p = str(path)
    if p in BUILTIN_TRACES and not Path(p).exists():
        return str(files("loadgen.data").joinpath(BUILTIN_TRACES[p]))
    return p


def open_trace(path: str | Path):
    """A binary file object over the trace: ``.gz`` files are decompressed on the fly."""
    p = resolve_trace(path)
    try:
        fh = open(p, "rb")
    except FileNotFoundError:
        raise InputError("trace", f"no file {p}; give a trace file's path or a built-in trace name"
                                  f" ({', '.join(BUILTIN_TRACES)})") from None
    except OSError as exc:
        raise InputError("trace", f"cannot read {p}: {exc.strerror or exc}") from None
    if p.endswith(".gz"):
        return gzip.GzipFile(fileobj=fh, mode="rb")
    return fh


def iter_json_lines(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line; malformed JSON names file and line."""
    p = str(path)
    return json_lines(p, open_trace(p), _parse_line)  # binary: invalid UTF-8 fails on its own line


def _parse_line(p: str, lineno: int, line: bytes) -> dict:
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        if lineno == 1 and line.startswith(b"version https://git-lfs"):
            raise TraceFormatError(p, 1, "file", "is a Git LFS pointer, not the trace (run `git lfs pull`)") from None
        raise TraceFormatError(p, lineno, "line", f"malformed JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise TraceFormatError(p, lineno, "line", "expected a JSON object")
    return obj


# --------------------------------------------------------------------------- kvemu


def parse_kvemu_request(path: str, lineno: int, obj: dict, previous: dict[str, list[int]] | None = None) -> TraceRequest:
    """One request line. Compact lines (format 2) carry ``prefix``: the number of leading
    hashes shared with the same session's previous request, then only the new ``hash_ids``."""
    kind = obj.get("kind")
    if kind not in _KINDS:
        raise TraceFormatError(path, lineno, "kind", f"expected one of single, multi, agent; got {kind!r:.40}")
    session = str(_field(path, lineno, obj, "session", (str, int)))
    hash_ids = _hash_list(path, lineno, obj, "hash_ids")
    if "prefix" in obj:
        shared = _field(path, lineno, obj, "prefix", (int,), minimum=0)
        before = (previous or {}).get(session, [])
        if shared > len(before):
            raise TraceFormatError(path, lineno, "prefix", f"{shared} blocks, but the session's previous request"
                                                           f" has {len(before)}")
        hash_ids = before[:shared] + hash_ids  # shares the int objects: 8 bytes per repeated access
    if previous is not None:
        previous[session] = hash_ids
    request = TraceRequest(
        t=float(_field(path, lineno, obj, "t", (int, float), minimum=0)),
        session=session,
        turn=_field(path, lineno, obj, "turn", (int,), minimum=0),
        hash_ids=hash_ids,
        input_tokens=_field(path, lineno, obj, "input_tokens", (int,), minimum=0),
        output_tokens=_field(path, lineno, obj, "output_tokens", (int,), minimum=0),
        kind=kind,
    )
    refuse_other_formats(path, lineno, obj, "kvemu")
    if "id" in obj or "after" in obj or "gap_s" in obj:
        request.id, request.after, request.gap_s = dependency_fields(path, lineno, obj)
    return request


def read_kvemu(path: str | Path, block_size: int | None = None) -> Trace:
    p = str(path)
    requests: list[TraceRequest] = []
    meta: dict = {}
    previous: dict[str, list[int]] = {}  # session -> its latest request's hashes (compact lines)
    linenos: list[int] = []
    for lineno, obj in iter_json_lines(p):
        if "kvemu_trace" in obj:
            meta = obj
            continue
        requests.append(parse_kvemu_request(p, lineno, obj, previous))
        linenos.append(lineno)
    if any(r.id is not None or r.after for r in requests):
        check_dependencies(p, requests, linenos)
    bs = block_size or int(meta.get("block_size", KVEMU_DEFAULT_BLOCK_SIZE))
    return Trace(requests=requests, block_size=bs, source=p, meta=meta)


def write_kvemu(trace: Trace, path: str | Path, compact: bool = True) -> None:
    """kvemu JSONL. ``compact`` (format 2, the default) writes a request as the number of leading
    hashes it shares with its session's previous request plus its new hashes, so a session's
    history is not repeated on every turn; readers take both forms. A path ending in ``.gz``
    is written gzip-compressed."""
    meta = {k: v for k, v in trace.meta.items() if k != HASHES_U64}  # a reader's own finding, not the file's
    header = {"kvemu_trace": 1, "block_size": trace.block_size, "source": trace.source, **meta}
    header["kvemu_trace"] = 2 if compact else 1
    previous: dict[str, list[int]] = {}
    opener = gzip.open if str(path).endswith(".gz") else open  # .jsonl.gz: compressed as it is written
    with opener(path, "wb") as fh:
        fh.write(orjson.dumps(header, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
        for r in trace.requests:
            rec: dict = {"t": round(r.t, 6), "session": r.session, "turn": r.turn}
            ids = r.hash_ids
            if compact:
                shared = shared_prefix(previous.get(r.session, ()), ids)
                previous[r.session] = ids
                rec["prefix"], rec["hash_ids"] = shared, ids[shared:]
            else:
                rec["hash_ids"] = ids
            rec["input_tokens"], rec["output_tokens"] = r.input_tokens, r.output_tokens
            if r.kind is not None:
                rec["kind"] = r.kind
            if r.id is not None:
                rec["id"] = r.id
            if r.after:
                rec["after"], rec["gap_s"] = list(r.after), r.gap_s
            fh.write(orjson.dumps(rec, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")


# --------------------------------------------------------------------------- Mooncake


def _parse_mooncake(path: str, lineno: int, obj: dict) -> tuple[float, list[int], int, int]:
    ts = _field(path, lineno, obj, "timestamp", (int, float), minimum=0)
    return (
        ts / 1000.0,
        _hash_list(path, lineno, obj, "hash_ids"),
        _field(path, lineno, obj, "input_length", (int,), minimum=0),
        _field(path, lineno, obj, "output_length", (int,), minimum=0),
    )


_MOONCAKE_FIELDS = ("timestamp", "hash_ids", "input_length", "output_length")
_MOONCAKE_KINDS = "nhii"  # a number >= 0, 64-bit unsigned hashes, two ints >= 0 (loadgen.jsonlines.KINDS)


def _well_formed_mooncake(p: str) -> list[list] | None:
    """``_parse_mooncake``'s values of a file where every line passes its checks, as four columns (times in
    seconds, hash lists, input and output lengths); None otherwise (the line-by-line reader then names the
    first culprit, as it always has)."""
    columns = typed_columns(open_trace(p), _MOONCAKE_FIELDS, _MOONCAKE_KINDS)
    if columns is not None:
        columns[0] = [t / 1000.0 for t in columns[0]]
    return columns


def read_mooncake(path: str | Path, block_size: int | None = None) -> Trace:
    p = str(path)
    columns = _well_formed_mooncake(p)
    if columns is None:
        rows = [_parse_mooncake(p, lineno, obj) for lineno, obj in iter_json_lines(p)]
        if not rows:
            raise TraceFormatError(p, 0, "file", "empty trace: no requests")
        columns = [list(column) for column in zip(*rows)]
    times, ids, n_in, n_out = columns
    reordered = any(map(operator.lt, islice(times, 1, None), times))
    if reordered:  # sessions are inferred in arrival order (a stable sort: ties keep the file's order)
        order = sorted(range(len(times)), key=times.__getitem__)
        times, ids, n_in, n_out = ([column[k] for k in order] for column in columns)
    sessions, turns = infer_sessions(ids)
    requests = list(map(TraceRequest, times, sessions, turns, ids, n_in, n_out))
    meta = {
        "source_format": "mooncake",
        "partial_tail_ids": True,  # the last id of a prompt may cover a partial block
        "session_inference": {"tail_blocks": TAIL_BLOCKS, "min_shared_blocks": MIN_SHARED_BLOCKS},
    }
    if reordered:
        meta["reordered_by_time"] = True
    return Trace(requests=requests, block_size=block_size or MOONCAKE_BLOCK_SIZE, source=p, meta=meta)


# --------------------------------------------------------------------------- Qwen-Bailian


class _BailianRow:
    __slots__ = ("lineno", "t", "chat_id", "parent", "raw", "n_in", "n_out", "type", "session", "turn", "chained")

    def __init__(self, lineno: int, t: float, chat_id, parent, raw: list[int], n_in: int, n_out: int, type_) -> None:
        self.lineno, self.t, self.chat_id, self.parent, self.raw = lineno, t, chat_id, parent, raw
        self.n_in, self.n_out, self.type = n_in, n_out, type_
        self.session: str | None = None
        self.turn = 0
        self.chained: list[int] = []


def _parse_bailian(path: str, lineno: int, obj: dict) -> _BailianRow:
    chat_id = _field(path, lineno, obj, "chat_id", (int, str))
    parent = obj.get("parent_chat_id")
    if parent not in _BAILIAN_ROOTS:
        parent = _field(path, lineno, obj, "parent_chat_id", (int, str))
        if parent == chat_id:
            raise TraceFormatError(path, lineno, "parent_chat_id", "a chat cannot be its own parent")
    else:
        parent = None
    # `turn` is checked but not used: the public spec does not say whether it starts at 0 or 1.
    _field(path, lineno, obj, "turn", (int,), required=False, minimum=0)
    type_ = _field(path, lineno, obj, "type", (str,), required=False)
    return _BailianRow(
        lineno,
        float(_field(path, lineno, obj, "timestamp", (int, float), minimum=0)),
        chat_id,
        parent,
        _hash_list(path, lineno, obj, "hash_ids"),
        _field(path, lineno, obj, "input_length", (int,), minimum=0),
        _field(path, lineno, obj, "output_length", (int,), minimum=0),
        type_,
    )


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    # A child prompt usually repeats its parent's prompt whole, or all but the padded last block.
    if a[:n] == b[:n]:
        return n
    if n and a[: n - 1] == b[: n - 1]:
        return n - 1
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


def _chain_bailian(row: _BailianRow, parent: _BailianRow | None) -> list[int]:
    """chain_ids(row.raw), reusing the parent's chained prefix where the raw ids agree."""
    if parent is None:
        return chain_ids(row.raw)
    k = _common_prefix_len(row.raw, parent.raw)
    if k == 0:
        return chain_ids(row.raw)
    return parent.chained[:k] + chain_ids(row.raw[k:], parent.chained[k - 1])


def _resolve_bailian(path: str, rows: list[_BailianRow]) -> int:
    """Set session, turn and chained ids on every row (parents first); return duplicate chat ids."""
    by_chat: dict = {}
    for r in rows:
        by_chat.setdefault(r.chat_id, r)
    duplicates = len(rows) - len(by_chat)
    for row in rows:
        if row.session is not None:
            continue
        stack = [row]
        on_stack = {id(row)}
        # Walk up to the first resolved ancestor, a root, or a parent outside the file.
        while True:
            top = stack[-1]
            up = by_chat.get(top.parent) if top.parent is not None else None
            if up is None or up.session is not None:
                break
            if id(up) in on_stack:
                raise TraceFormatError(path, top.lineno, "parent_chat_id", f"cycle in the chat lineage at chat {top.chat_id!r:.40}")
            stack.append(up)
            on_stack.add(id(up))
        for r in reversed(stack):
            if r.session is not None:
                continue
            up = by_chat.get(r.parent) if r.parent is not None else None
            if up is not None:
                r.session, r.turn = up.session, up.turn + 1
            elif r.parent is None:
                r.session, r.turn = str(r.chat_id), 0
            else:
                # The parent came before the trace window: siblings still share a session,
                # and the turn counts the one ancestor we know exists.
                r.session, r.turn = str(r.parent), 1
            r.chained = _chain_bailian(r, up)
    return duplicates


def read_bailian(path: str | Path, block_size: int | None = None) -> Trace:
    p = str(path)
    rows = [_parse_bailian(p, lineno, obj) for lineno, obj in iter_json_lines(p)]
    if not rows:
        raise TraceFormatError(p, 0, "file", "empty trace: no requests")
    rows.sort(key=lambda r: r.t)
    duplicates = _resolve_bailian(p, rows)
    requests = [
        TraceRequest(t=r.t, session=str(r.session), turn=r.turn, hash_ids=r.chained, input_tokens=r.n_in, output_tokens=r.n_out)
        for r in rows
    ]
    types: dict[str, int] = {}
    for r in rows:
        if r.type is not None:
            types[r.type] = types.get(r.type, 0) + 1
    meta: dict = {"source_format": "bailian", "partial_tail_ids": True, "chain_root": ROOT_HASH, "type_counts": types}
    if duplicates:
        meta["duplicate_chat_ids"] = duplicates
    return Trace(requests=requests, block_size=block_size or BAILIAN_BLOCK_SIZE, source=p, meta=meta)


# --------------------------------------------------------------------------- dispatch

def read_openai(path: str | Path, block_size: int | None = None) -> Trace:
    """A request log of OpenAI bodies (``loadgen.log_trace``): prompts rendered and cut into blocks."""
    from loadgen.log_trace import read_openai_log

    return read_openai_log(path, block_size)


def read_llmservingsim(path: str | Path, block_size: int | None = None) -> Trace:
    """LLMServingSim's token-id workloads (``loadgen.token_trace``): exact prompts, arrivals and output lengths."""
    from loadgen.token_trace import read_llmservingsim as read

    return read(path, iter_json_lines(path), block_size)


def read_agentic(path: str | Path, block_size: int | None = None) -> Trace:
    """Dynamo's agentic Mooncake rows (``wait_for``, ``tool_wait_ms``): ``loadgen.agentic_mooncake``."""
    from loadgen.agentic_mooncake import read_agentic_mooncake

    return read_agentic_mooncake(path, iter_json_lines(path), block_size or MOONCAKE_BLOCK_SIZE)  # the rows say none


def read_cc_traces(path: str | Path, block_size: int | None = None) -> Trace:
    """SemiAnalysis's Claude Code traces, a session a line with its subagents: ``loadgen.cc_traces``."""
    from loadgen.cc_traces import read_sessions

    return read_sessions(path, iter_json_lines(path), block_size)


_READERS = {"kvemu": read_kvemu, "mooncake": read_mooncake, "bailian": read_bailian, "openai": read_openai,
            "llmservingsim": read_llmservingsim, "agentic-mooncake": read_agentic, "cc-traces": read_cc_traces}


def detect_format(path: str | Path) -> str:
    """The format of ``path``, judged from the keys of its first JSON object."""
    p = str(path)
    for lineno, obj in iter_json_lines(p):
        if "messages" in obj or "prompt" in obj or isinstance(obj.get("body"), dict):  # a request log
            return "openai"
        if "input_tok_ids" in obj or "arrival_time_ns" in obj:  # token ids: LLMServingSim's workloads
            return "llmservingsim"
        if "request_id" in obj or "wait_for" in obj:  # Dynamo's agentic Mooncake rows (input_tokens is an alias there)
            return "agentic-mooncake"
        if isinstance(obj.get("requests"), list) and "hash_id_scope" in obj:  # a Claude Code session, subagents in it
            return "cc-traces"
        if "kvemu_trace" in obj or "session" in obj or "input_tokens" in obj:
            return "kvemu"
        if "chat_id" in obj or "parent_chat_id" in obj:
            return "bailian"
        if "input_length" in obj or "hash_ids" in obj:
            return "mooncake"
        keys = ", ".join(sorted(obj))[:80]
        raise TraceFormatError(p, lineno, "line", f"cannot tell the trace format from keys ({keys}); pass a format: {', '.join(FORMATS)}")
    raise TraceFormatError(p, 0, "file", "empty trace: no requests")


# What one id of a hash format stands for where its file does not say (kvemu JSONL says so in its header).
# (cc-traces states its own in every line: the reader's meta block_size)
_FORMAT_BLOCK_SIZES = {"mooncake": MOONCAKE_BLOCK_SIZE, "bailian": BAILIAN_BLOCK_SIZE}


def read_at_block_size(path: str | Path, fmt: str, block_size: int | None, flag: str = "--block-size") -> Trace:
    """A trace whose blocks are ``block_size`` tokens, for a run whose pool counts blocks of that size (None:
    the trace's own). A request log is cut at it; a trace of hashes is not re-cut, since each id stands for
    its own block's tokens, which the trace does not have: one that states another size (its format's, or
    a kvemu header's) is refused, naming ``flag``; one that states none (a kvemu JSONL without a header's
    ``block_size``) is read as having blocks of ``block_size``."""
    name = detect_format(path) if fmt == "auto" else fmt
    if block_size is None or name in TOKEN_FORMATS:
        return read_trace(path, name, block_size)
    trace = read_trace(path, name)
    own = _FORMAT_BLOCK_SIZES.get(name) or trace.meta.get("block_size")
    if own is None:
        trace.block_size = block_size
    elif int(own) != block_size:
        raise InputError(flag, f"{path}'s hash ids each stand for a block of {own} tokens, which cannot be cut into"
                               f" blocks of {block_size}: drop {flag} (the run takes the trace's {own}), or study"
                               f" {block_size}-token blocks on a preset (--workload) or a request log (--format openai)")
    return trace


def read_trace(path: str | Path, fmt: str = "auto", block_size: int | None = None) -> Trace:
    """Read a trace in any supported format; ``fmt="auto"`` looks at the first record."""
    if fmt != "auto" and fmt not in _READERS:
        raise UnknownNameError("trace format", fmt, ("auto", *FORMATS))
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0):
        raise InputError("block_size", f"must be a positive integer, got {block_size!r}")
    name = detect_format(path) if fmt == "auto" else fmt
    key = None
    if trace_cache.cache_dir() is not None and name != "llmservingsim":  # the cache keeps no token ids
        key = trace_cache.cache_key(resolve_trace(path), name, block_size)
        cached = trace_cache.load(key)
        if cached is not None:
            cached.source = str(path)
            return cached
    with gc_paused():
        trace = _READERS[name](path, block_size)
    if not trace.requests:
        raise TraceFormatError(str(path), 0, "file", "empty trace: no requests")
    trace.meta[HASHES_U64] = True  # every reader checked its hashes or made them by xxhash
    if key is not None:
        trace_cache.store(key, trace)
    return trace
