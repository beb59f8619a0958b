"""A typed-array cache of parsed traces, keyed by the file's content, so a trace is parsed once.

Parsing a large JSONL trace (and inferring Mooncake sessions) costs seconds; loading its
columns back costs a fraction of that. The cache holds, per (file bytes, format, block
size, cache version), one ``.npz`` of columns: times, turns, token counts, session / kind
tables, the dependency fields of the requests that have them (``id``, ``after``, ``gap_s``)
and, per request, how many leading hashes it shares with its session's previous
request (``prefix``) and offsets into one ``uint64`` array of the rest. As kvemu's compact
JSONL, a read rebuilds a turn from its predecessor's list, so the repeated hashes share
their int objects (8 bytes per repeated access, not a new 32-byte int each). It lives in
``$KVEMU_CACHE_DIR`` (default ``$XDG_CACHE_HOME/kvemu`` or ``~/.cache/kvemu``) under
``traces/``; ``KVEMU_CACHE_DIR=off`` disables it. A cache that cannot be written or read
is skipped, never an error: the trace is parsed instead.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np
import xxhash

from loadgen.trace import Trace, TraceRequest, shared_prefix
from shared.gc_tuning import gc_paused

CACHE_VERSION = 3  # bump when a reader's output for the same bytes changes


def cache_dir() -> Path | None:
    configured = os.environ.get("KVEMU_CACHE_DIR")
    if configured == "off":
        return None
    if configured:
        return Path(configured) / "traces"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvemu" / "traces"


def cache_key(path: str, fmt: str, block_size: int | None) -> str:
    """What makes two reads the same: the file's bytes, the format, the block size, this code."""
    h = xxhash.xxh3_128()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 22), b""):
            h.update(chunk)
    h.update(f"|{fmt}|{block_size}|v{CACHE_VERSION}".encode())
    return h.hexdigest()


def load(key: str) -> Trace | None:
    folder = cache_dir()
    if folder is None:
        return None
    try:
        with np.load(folder / f"{key}.npz", allow_pickle=False) as z:
            cols = {name: z[name] for name in z.files}
    except (OSError, ValueError, KeyError):
        return None
    return _from_columns(cols)


def store(key: str, trace: Trace) -> None:
    folder = cache_dir()
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".npz.tmp")
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, **_to_columns(trace))  # type: ignore[arg-type]  # numpy stubs: **arrays is fine
        os.replace(tmp, folder / f"{key}.npz")  # atomic: readers never see half a file
    except OSError:
        return


def _to_columns(trace: Trace) -> dict[str, np.ndarray]:
    reqs = trace.requests
    sessions: dict[str, int] = {}
    kinds: dict[str | None, int] = {}
    prefix = np.zeros(len(reqs), dtype=np.int64)
    previous: dict[str, list[int]] = {}
    new: list[int] = []
    starts = [0]
    for k, r in enumerate(reqs):
        shared = prefix[k] = shared_prefix(previous.get(r.session, ()), r.hash_ids)
        new += r.hash_ids[shared:]
        starts.append(len(new))
        previous[r.session] = r.hash_ids
    return {
        "t": np.fromiter((r.t for r in reqs), dtype=np.float64, count=len(reqs)),
        "session": np.fromiter((sessions.setdefault(r.session, len(sessions)) for r in reqs), dtype=np.int64),
        "turn": np.fromiter((r.turn for r in reqs), dtype=np.int64, count=len(reqs)),
        "input_tokens": np.fromiter((r.input_tokens for r in reqs), dtype=np.int64, count=len(reqs)),
        "output_tokens": np.fromiter((r.output_tokens for r in reqs), dtype=np.int64, count=len(reqs)),
        "kind": np.fromiter((kinds.setdefault(r.kind, len(kinds)) for r in reqs), dtype=np.int64),
        "prefix": prefix,
        "starts": np.array(starts, dtype=np.int64),
        "hashes": np.array(new, dtype=np.uint64),
        "session_names": np.array(list(sessions), dtype=np.str_),
        "kind_names": np.array(json.dumps(list(kinds))),
        "header": np.array(json.dumps({"block_size": trace.block_size, "source": trace.source,
                                       "meta": trace.meta})),
        # the few requests that have a name or wait for others: [index, id, after, gap_s]
        "dependencies": np.array(json.dumps([[k, r.id, list(r.after), r.gap_s] for k, r in enumerate(reqs)
                                             if r.id is not None or r.after])),
    }


def _from_columns(c: dict[str, np.ndarray]) -> Trace:
    header = json.loads(str(c["header"]))
    names = c["session_names"].tolist()
    kinds = json.loads(str(c["kind_names"]))
    with gc_paused():
        requests = _requests(c, names, kinds, c["hashes"].tolist(), c["starts"].tolist())
    for k, name, after, gap in json.loads(str(c["dependencies"])):
        requests[k].id, requests[k].after, requests[k].gap_s = name, tuple(after), gap
    return Trace(requests, header["block_size"], header["source"], header["meta"])


def _requests(c: dict[str, np.ndarray], names: list, kinds: list, flat: list, starts: list) -> list[TraceRequest]:
    previous: dict[int, list[int]] = {}  # session index -> its latest request's hashes
    out = []
    for k, (t, s, turn, n_in, n_out, kind, shared) in enumerate(zip(
            c["t"].tolist(), c["session"].tolist(), c["turn"].tolist(), c["input_tokens"].tolist(),
            c["output_tokens"].tolist(), c["kind"].tolist(), c["prefix"].tolist())):
        new = flat[starts[k]:starts[k + 1]]
        hashes = previous[s][:shared] + new if shared else new
        previous[s] = hashes
        out.append(TraceRequest(t, names[s], turn, hashes, n_in, n_out, kinds[kind]))
    return out
