"""What a --tp step's all-reduces cost, per link: the table in docs/calibration.md ("Tensor parallelism").

    python bench/bench_allreduce.py [--model qwen3-32b] [--tp 2] [--gpus rtx-pro-6000,h100]
                                    [--tokens 1,64,256,2048] [--gpu-file PROFILE.json]

Per GPU preset and step size (tokens): NCCL's choice for one all-reduce of ``tokens x hidden x dtype``
bytes (shared/collectives.py) and its microseconds, the step's all-reduces in milliseconds (two a layer and
one after the embedding), the same under the form kvemu used before (two a layer at the card's
``link_bandwidth``, no per-call latency) and at a flat 16 GB/s; and, with ``--gpu-file`` (a profile from
``kvemu calibrate``, its GPU first in ``--gpus``' place), the step's whole time as a decode of that many
sequences at 1,024 tokens of context each, or a prefill chunk of 2,048. Prints JSON; no device needed.
"""

from __future__ import annotations

import argparse
import json

from shared.collectives import all_reduce
from shared.costmodel import CostModel, StepWork


def old_form(cost: CostModel, tokens: int, bytes_per_s: float) -> float:
    """Two ring all-reduces a layer at a flat rate, no latency: what kvemu priced before."""
    m, tp = cost.model, cost.tp
    return m.layers * 2 * 2 * (tp - 1) / tp * m.hidden * m.dtype_bytes * tokens / bytes_per_s


def row(cost: CostModel, tokens: int) -> dict:
    m = cost.model
    nbytes = tokens * m.hidden * m.dtype_bytes
    one = all_reduce(cost.link, cost.tp, nbytes)
    work = StepWork.of([(tokens, 0)]) if tokens >= 2048 else StepWork(decoders=tokens, decode_kv=1024 * tokens)
    return {"tokens": tokens, "message_bytes": nbytes, "algorithm": one.algorithm, "protocol": one.protocol,
            "all_reduce_us": round(one.seconds * 1e6, 2), "step_all_reduces_ms": round(cost.all_reduce_s(tokens) * 1e3, 3),
            "before_ms": round(old_form(cost, tokens, cost.gpu.link_bandwidth) * 1e3, 3),
            "flat_16GBps_ms": round(old_form(cost, tokens, 16e9) * 1e3, 3),
            "step_ms": round(cost.step_time(work) * 1e3, 3), "step": "prefill" if tokens >= 2048 else "decode"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-32b")
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--gpus", default="rtx-pro-6000,h100")
    ap.add_argument("--tokens", default="1,64,256,2048")
    ap.add_argument("--gpu-file", default=None, help="a kvemu calibrate profile priced beside the presets")
    args = ap.parse_args()
    specs = [g.strip() for g in args.gpus.split(",") if g.strip()] + ([args.gpu_file] if args.gpu_file else [])
    out = {}
    for spec in specs:
        cost = CostModel.from_names(args.model, f"{spec}@tp{args.tp}")
        link = cost.link
        out[spec] = {"link": link.kind, "bus_GBps": round(link.bus_bytes_per_s / 1e9, 2),
                     "peer_to_peer": link.peer_to_peer,
                     "rows": [row(cost, int(t)) for t in args.tokens.split(",")]}
    print(json.dumps({"model": args.model, "tp": args.tp, "gpus": out}, indent=1))


if __name__ == "__main__":
    main()
