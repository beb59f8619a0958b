"""The step price of a layer stack against Vidur's published operator profiles (A100, H100).

Vidur (microsoft/vidur, MIT) profiled every operator of a decoder layer on real GPUs with vLLM's
kernels: ``data/profiling/compute/{a100,h100}/<model>/mlp.csv``, kernel times at each token
count. ``bench/data/vidur/mlp_ops.csv`` is a subset of those files (tensor parallelism 1, 13
token counts, the median columns; see bench/data/vidur/README.md). One forward of ``T`` tokens
through the layer stack is, as Vidur's own predictor sums it, per layer: both RMSNorms, the
QKV and output projections, rotary, the MLP's up (gate and up) and down projections, its
activation and the residual add; times the layers. Attention is not in these files (Vidur's
attention.csv is stored out of the repository), nor the LM head, so kvemu's side is the same
work: a step of ``T`` tokens with no attention (``T`` decoders over no KV up to the graph
size, a ``T``-token chunk at depth 0 with its attention taken out above it) of the model's
layers only (the LM head priced at zero).

Per pair and token count: Vidur's seconds, kvemu's under each efficiency variant, and the
error (kvemu / Vidur - 1); then the median and worst absolute error over all points of each
variant, and over the small-batch (weight-bound) points alone. The variants are the shipped
preset and the preset with the graph-replayed fixed cost at 0 (what the last round shipped).

    .venv/bin/python bench/bench_costmodel_vidur.py
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import replace
from pathlib import Path

from shared.costmodel import CostModel, StepWork, get_gpu, get_model

DATA = Path(__file__).resolve().parent / "data" / "vidur" / "mlp_ops.csv"
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
SMALL = 16  # tokens: at most this many, every pair's step is weight-bound (the decode regime)


def vidur_forward(row: dict, layers: int) -> float:
    """Seconds of one forward through ``layers`` layers, as Vidur's predictor sums its operators."""
    return layers * sum(float(row[f"{op}_ms"]) for op in LAYER_OPS) / 1e3


def kvemu_forward(cost: CostModel, tokens: int) -> float:
    """kvemu's price of the same work: layers only, no attention."""
    if tokens <= cost.efficiency.graph_tokens:
        return cost.step_time(StepWork(decoders=tokens))
    return cost.step_time(StepWork(prefill_tokens=tokens, prefill_seqs=1))


def variants(model: str, gpu: str) -> dict[str, CostModel]:
    layers_only = replace(get_model(model), vocab=0)  # no LM head: Vidur's layer files have none
    shipped = CostModel(layers_only, get_gpu(gpu))
    return {"preset": shipped,
            "no_graph_fixed_cost": shipped.with_efficiency(replace(shipped.efficiency, decode_overhead_s=0.0))}


def summary(errs: list[float]) -> dict:
    mags = [abs(e) for e in errs]
    return {"median_abs": round(statistics.median(mags), 4), "worst_abs": round(max(mags), 4),
            "mean": round(statistics.fmean(errs), 4), "points": len(errs)}


def main() -> None:
    with DATA.open() as fh:
        rows = list(csv.DictReader(fh))
    points, errs, small = [], {}, {}
    for row in rows:
        model, gpu, tokens = row["kvemu_model"], row["gpu"], int(row["num_tokens"])
        models = variants(model, "a100-80gb" if gpu == "a100" else "h100")
        vidur = vidur_forward(row, models["preset"].model.layers)
        point = {"gpu": gpu, "model": model, "tokens": tokens, "vidur_s": round(vidur, 6)}
        for name, cost in models.items():
            t = kvemu_forward(cost, tokens)
            point[name + "_s"], point[name + "_error"] = round(t, 6), round(t / vidur - 1, 4)
            errs.setdefault(name, []).append(t / vidur - 1)
            if tokens <= SMALL:
                small.setdefault(name, []).append(t / vidur - 1)
        points.append(point)
    print(json.dumps({
        "data": "bench/data/vidur/mlp_ops.csv (microsoft/vidur data/profiling/compute, MIT)",
        "pairs": sorted({f"{p['model']} on {p['gpu']}" for p in points}),
        "points": points,
        "errors": {name: summary(e) for name, e in errs.items()},
        f"errors_at_most_{SMALL}_tokens": {name: summary(e) for name, e in small.items()},
    }, indent=1))


if __name__ == "__main__":
    main()
