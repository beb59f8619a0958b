"""The decode sweep of ``bench/bench_step_cost.py --decode-sweep``: what tells a decode step's terms apart.

A dense model's decode steps read the same weights every step, so a sweep of whole steps alone
cannot tell the weight read's efficiency (``memory``) from a fixed cost a layer
(``decode_overhead_s``): both are the step's intercept. This sweep times three things, each
replayed through a CUDA graph on a GPU (eager on the CPU), and writes them in the format of
docs/calibration/h200-llama-3-8b.json (``decode`` beside its ``prefill``):

* ``decode``: whole decode steps, batch x context per sequence (default 1, 4, 16, 64 x 1K,
  8K): the layer stack, then the LM head over the batch's last hidden states (what a step reads:
  the head, not the input embedding). Every layer has its own K/V (never shared between layers,
  so no layer's KV is served from the L2 cache another layer filled);
* ``projections``: the four weight products of every layer alone (QKV, output, gate-up, down)
  at each batch: their time over their bytes is the weight read's rate, without the small
  kernels (norms, rotary, activation, attention) or their launch gaps;
* ``lm_head``: the LM head's product alone at each batch.

``decode`` at batch 1 less ``projections`` and ``lm_head`` at batch 1 is the fixed cost of the
layers' other kernels and gaps plus the attention over the context: its change with the context
is the KV read; what is left at the smallest context, over the layers, is ``decode_overhead_s``.
"""

from __future__ import annotations

import torch

METHOD_NOTE = ("decode sweep: whole steps (layer stack + LM head over the batch), each layer's own K/V; the four "
               "weight products of every layer alone; the LM head alone; all replayed through a CUDA graph on a GPU, "
               "eager on the CPU; minimum of the timings")


def _past(bench, batch: int, context: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    s = bench.spec
    shape = (batch, s.kv_heads, context + 1, s.head_dim)
    layers = range(len(bench.stack.layers))
    return [bench._rand(*shape) for _ in layers], [bench._rand(*shape) for _ in layers]


def _projections(bench, x: torch.Tensor):
    """The layers' weight products alone, over a batch ``x`` [B, hidden]."""
    stack = bench.stack
    attn = bench._rand(x.shape[0], stack.layers[0].wo.shape[0])
    mid = bench._rand(x.shape[0], stack.layers[0].down.shape[-2])

    def run() -> None:
        for w in stack.layers:
            x @ w.wqkv
            attn @ w.wo
            x @ w.gate_up
            mid @ w.down
    return run


def _decode_step(bench, x: torch.Tensor, context: int) -> float:
    """Seconds of one whole decode step of the batch ``x`` at ``context`` tokens a sequence."""
    stack, head = bench.stack, bench.stack.embed  # [vocab, hidden]: the LM head's shape
    past_k, past_v = _past(bench, x.shape[0], context)
    pos = torch.full((x.shape[0],), context, device=bench.device)
    return round(bench.time(bench._graphed(lambda: stack.decode(x, pos, past_k, past_v) @ head.T)), 7)


def _head(bench, x: torch.Tensor) -> float:
    head = bench.stack.embed
    return round(bench.time(bench._graphed(lambda: x @ head.T)), 7)


def sweep(bench, batches: list[int], contexts: list[int]) -> dict:
    """Seconds of each measurement (see the module docstring)."""
    decode, projections, lm_head = [], [], []
    with torch.inference_mode():
        for b in batches:
            x = bench._rand(b, bench.spec.hidden)
            projections.append({"batch": b, "seconds": round(bench.time(bench._graphed(_projections(bench, x))), 7)})
            lm_head.append({"batch": b, "seconds": _head(bench, x)})
            for c in contexts:
                decode.append({"batch": b, "context": c, "seconds": _decode_step(bench, x, c)})
                if bench.device.type == "cuda":
                    torch.cuda.empty_cache()  # this point's K/V (up to 69 GB at 64 x 8K) gone before the next
    return {"decode": decode, "projections": projections, "lm_head": lm_head}


def compare(cost, result: dict) -> list[dict]:
    """Each decode point beside ``cost``'s price of it (``cost``: the model at the swept layers)."""
    rows = []
    for p in result["decode"]:
        model = cost.decode_step_time(p["batch"], p["batch"] * p["context"])
        rows.append({**p, "model_s": round(model, 7), "error": round(model / p["seconds"] - 1, 4)})
    return rows
