"""Vidur's operator profiles (microsoft/vidur, MIT; the subset in bench/data/vidur) as measured steps.

``mlp_ops.csv`` holds, per GPU, model, tensor-parallel degree and token count, the kernel time of
every operator of a decoder layer but attention (the torch profiler's, milliseconds). One forward
of ``T`` tokens through the layer stack is their sum times the model's layers, as Vidur's own
predictor sums them (bench/bench_costmodel_vidur.py sets the presets beside the same sums). Nothing
here has attention or an LM head, so a fit on them sees the products, the weight read and the fixed
costs only; the other terms keep their prior. A forward of at most ``DECODE_TOKENS`` tokens is the
layers of a decode step of that many sequences, a longer one those of a prefill chunk.
"""

from __future__ import annotations

import csv
import os

from shared.costfit import StepPoint
from shared.costmodel import get_gpu, get_model
from shared.errors import InputError, KvemuError

FIELD = "--from-profile"
FILE = "mlp_ops.csv"
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
DECODE_TOKENS = 256  # vLLM's default max_num_seqs: a forward this small is a decode step's


def is_vidur(path: str) -> bool:
    return os.path.isfile(os.path.join(path, FILE))


def _preset(name: str, lookup) -> str:
    try:
        return lookup(name).name
    except KvemuError:
        return ""


def read_vidur(path: str, gpu: str, model: str, tp: int) -> dict[str, list[StepPoint]]:
    """The rows of ``gpu`` (a preset name), ``model`` (a preset name) and ``tp`` as steps of the
    model's layers, without attention: by kind, decode (at most ``DECODE_TOKENS`` tokens) and prefill."""
    where = os.path.join(path, FILE)
    with open(where, newline="") as fh:
        rows = list(csv.DictReader(fh))
    need = ("gpu", "kvemu_model", "num_tokens", "tp", *(f"{op}_ms" for op in LAYER_OPS))
    missing = [c for c in need if rows and c not in rows[0]]
    if not rows or missing:
        raise InputError(FIELD, f"{where}: no column {missing[0] if missing else need[0]!r}")
    layers = get_model(model).layers
    out: dict[str, list[StepPoint]] = {"prefill": [], "decode": []}
    pairs = set()
    for line, row in enumerate(rows, start=2):
        pairs.add(f"{row['kvemu_model']} on {row['gpu']} at tp {row['tp']}")
        if _preset(row["gpu"], get_gpu) != gpu or _preset(row["kvemu_model"], get_model) != model:
            continue
        try:
            if int(row["tp"]) != tp:
                continue
            tokens = int(row["num_tokens"])
            seconds = layers * sum(float(row[f"{op}_ms"]) for op in LAYER_OPS) / 1e3
        except ValueError as exc:
            raise InputError(FIELD, f"{where}:{line}: {exc}") from None
        if tokens <= DECODE_TOKENS:
            out["decode"].append(StepPoint((), (0,) * tokens, seconds, attention=False))
        else:
            out["prefill"].append(StepPoint(((tokens, 0),), (), seconds, attention=False))
    if not out["decode"] and not out["prefill"]:
        raise InputError(FIELD, f"{where}: no row for {model} on {gpu} at tp {tp} (it has: {', '.join(sorted(pairs))})")
    return out
