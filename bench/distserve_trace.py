"""A DistServe workload file (``workload/vllm-N-R.exp``: a JSON list of ``prompt_len``, ``output_len``,
``start_time``) as a kvemu trace, so `kvemu sim --trace` replays the requests DistServe's vLLM baseline
served (arrivals as given, output lengths pinned).

The workload carries lengths, not tokens: each prompt gets block hashes of its own (``chain_ids`` over
ids no other request uses), so no two requests share a cached block, as none of DistServe's ShareGPT
prompts is known to. Request k is line k of the trace, the index `kvemu compare` matches the measured
``.exp`` by (DistServe issues its workload in order). ``--time-scale F`` multiplies every arrival time by F
(the same requests at 1/F times the rate: a prediction between the measured rates, with nothing measured
to compare it with).

    .venv/bin/python bench/distserve_trace.py WORKLOAD.exp -o trace.jsonl [--time-scale F]
"""

from __future__ import annotations

import argparse
import json
import sys

from loadgen.formats import KVEMU_DEFAULT_BLOCK_SIZE, write_kvemu
from loadgen.trace import Trace, TraceRequest
from shared.errors import KvemuError
from shared.hashing import chain_ids


def _length(path: str, i: int, item: dict, name: str, minimum: int) -> int:
    value = item.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise KvemuError(f"{path}: request {i}: {name} must be an integer >= {minimum}, got {value!r}")
    return value


def read_workload(path: str, block_size: int = KVEMU_DEFAULT_BLOCK_SIZE, time_scale: float = 1.0) -> Trace:
    """The workload's requests in its order, each with ``block_size``-token blocks of its own, arriving at
    ``time_scale`` x their start times."""
    try:
        with open(path, "rb") as fh:
            items = json.load(fh)
    except OSError as exc:
        raise KvemuError(f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError:
        raise KvemuError(f"{path}: not JSON (expected DistServe's workload: a list of prompt_len, output_len,"
                         " start_time)") from None
    if not isinstance(items, list) or not items or not all(isinstance(i, dict) for i in items):
        raise KvemuError(f"{path}: expected a list of requests (prompt_len, output_len, start_time)")
    requests = []
    for i, item in enumerate(items):
        prompt, output = _length(path, i, item, "prompt_len", 1), _length(path, i, item, "output_len", 1)
        t = item.get("start_time")
        if not isinstance(t, int | float) or isinstance(t, bool) or not 0 <= t < float("inf"):
            raise KvemuError(f"{path}: request {i}: start_time must be a number >= 0, got {t!r}")
        # ids (i, j) no other request has: request i's blocks are its own
        ids = [(i << 24) + j for j in range(prompt // block_size)]
        requests.append(TraceRequest(float(t) * time_scale, str(i), 0, chain_ids(ids), prompt, output, "single"))
    return Trace(requests, block_size, path, {"from": "DistServe workload"})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("workload", help="DistServe's workload/vllm-N-R.exp")
    p.add_argument("-o", "--out", required=True, help="the kvemu trace to write (.jsonl)")
    p.add_argument("--time-scale", type=float, default=1.0, metavar="F",
                   help="arrivals at F x the workload's start times (F > 0; default 1)")
    args = p.parse_args(argv)
    try:
        if not 0 < args.time_scale < float("inf"):
            raise KvemuError(f"--time-scale: must be a finite number > 0, got {args.time_scale}")
        trace = read_workload(args.workload, time_scale=args.time_scale)
    except KvemuError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_kvemu(trace, args.out)
    print(f"{len(trace.requests)} requests -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
