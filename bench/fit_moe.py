"""The fused-MoE layer's constants, fitted to NVIDIA's measured MoE table of an H200 (docs/calibration.md).

    .venv/bin/python bench/fit_moe.py

Reads bench/data/aiconfigurator (aiconfigurator's per-GPU MoE kernel times: vLLM 0.19.0's ``fused_moe``, bf16,
one H200) and fits ``shared.moe_cost.MoeKernel``'s form, a fixed cost a layer plus the touched experts'
weights at ``memory`` x HBM bandwidth or the tokens' products at ``linear`` x peak FLOP/s, whichever is
slower, to Qwen3-30B-A3B's layer (hidden 2048, 128 experts of 768, 8 a token) on the rows whose routing is
``balanced`` (the collector sends T tokens to exactly min(8 T, 128) experts, so the touched count is known),
one GPU (moe_tp 1, ep 1): weighted least squares on the relative error (shared.costfit.nnls_relative), each
row's side of the max settled in a few rounds. Prints JSON: the constants, the in-sample errors, and held
out: the same layer split over 2 and 4 GPUs (moe_tp: each GPU a slice of every expert, priced at tokens / tp
and experts / tp), the power-law routings (touched count unknown: priced at uniform routing's expectation,
as kvemu prices a step), 11 other bf16 shapes with these constants, and LLMServingSim's RTX PRO 6000 table
(bench/data/llmservingsim/moe: another GPU, scaled by its datasheet bandwidth and peak). Last, the MoE
presets' ``linear`` and ``attention`` solved again on When Fancy Eviction Fails' two prefill points with the
MoE layer priced by these constants (two points, two unknowns). Nothing here is fitted to a serving run.
"""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np

from shared.costfit import nnls_relative
from shared.costmodel import CostModel, get_gpu
from shared.model_presets import MODELS
from shared.moe_cost import FUSED_MOE_H200, MoeFit, MoeKernel

DATA = Path(__file__).resolve().parent / "data"
AIC = DATA / "aiconfigurator" / "h200_sxm" / "vllm" / "0.19.0"
LSS_MOE = DATA / "llmservingsim" / "moe" / "RTXPRO6000" / "Qwen3-30B-A3B-Instruct-2507" / "tp1" / "moe.csv"
QWEN = (2048.0, 768.0, 128.0, 8.0)  # hidden, expert width, experts, top-k
# When Fancy Eviction Fails (docs/sources.md): Qwen3-Coder-30B-A3B on one H200, 8K new tokens after 0 and 64K cached
FANCY = ((8192, 0, 0.166), (8192, 65536, 0.966))


def read(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return [{k: (v if k in ("kernel_source", "moe_dtype", "distribution") else float(v)) for k, v in r.items()}
                for r in csv.DictReader(fh)]


Shape = tuple[float, float, float, float]  # hidden, expert width, experts, top-k


def shape_rates(shape: Shape) -> tuple[float, float]:
    """One expert's bytes (SwiGLU: gate, up, down in bf16) and one token's products over its top-k experts."""
    hidden, width, _, topk = shape
    return 3 * hidden * width * 2, 2 * 3 * hidden * width * topk


def kernel(fit: MoeFit, shape: Shape, gpu: str = "h200") -> MoeKernel:
    g = get_gpu(gpu)
    eb, tf = shape_rates(shape)
    return MoeKernel.of(fit.floor_s, fit.memory, fit.linear, (), eb, tf, g.hbm_bandwidth, g.peak_flops)


def fit_kernel(points: list[tuple[float, float, float]], shape: Shape, rounds: int = 8) -> MoeFit:
    """``points``: (tokens, experts, seconds) of one GPU. Sides of the max settled round by round."""
    g = get_gpu("h200")
    eb, tf = shape_rates(shape)
    t, e, s = (np.array(c, dtype=float) for c in zip(*points))
    mem, comp = e * eb / g.hbm_bandwidth, t * tf / g.peak_flops  # at efficiency 1
    fit = MoeFit(0.0, 1.0, 1.0)
    for _ in range(rounds):
        memory_side = mem / fit.memory >= comp / fit.linear
        x = np.column_stack([np.ones_like(s), np.where(memory_side, mem, 0.0), np.where(memory_side, 0.0, comp)])
        floor, inv_mem, inv_lin = nnls_relative(x, s)
        fit = MoeFit(float(floor), 1.0 / inv_mem if inv_mem > 0 else fit.memory,
                     1.0 / inv_lin if inv_lin > 0 else fit.linear)
    return fit


def errors(k: MoeKernel, points: list[tuple[float, float, float]]) -> dict:
    rel = np.array([k.seconds(t, e) / s - 1 for t, e, s in points])
    return {"points": len(rel), "mean_abs": round(float(np.abs(rel).mean()), 4),
            "max_abs": round(float(np.abs(rel).max()), 4), "signed_mean": round(float(rel.mean()), 4)}


def balanced(rows: list[dict], tp: int = 1) -> list[tuple[float, float, float]]:
    """(tokens, experts, seconds) per GPU of the balanced rows at moe_tp ``tp``, ep 1."""
    return [(r["num_tokens"] / tp, min(r["num_tokens"] * r["topk"], r["num_experts"]) / tp, r["latency"] * 1e-3)
            for r in rows if r["distribution"] == "balanced" and r["moe_tp_size"] == tp and r["moe_ep_size"] == 1]


def preset_solve(fit: MoeFit) -> dict:
    """The MoE presets' linear and attention on When Fancy Eviction Fails' two points, the MoE layer known."""
    base = CostModel.from_names("qwen3-coder-30b-a3b", "h200")
    e = replace(base.efficiency, linear=1.0, attention=1.0, moe_floor_s=fit.floor_s, moe_memory=fit.memory,
                moe_linear=fit.linear)
    unit = base.with_efficiency(e)
    a, b = [], []
    for n, c, seconds in FANCY:
        p = unit.prefill_parts(n, c)
        assert p.compute_side > p.memory_side  # 8K tokens: the products outweigh the weights
        a.append([p.linear + p.head, p.attention])
        b.append(seconds - p.moe - p.kv_read - p.comm - p.overhead)
    inv_lin, inv_att = np.linalg.solve(np.array(a), np.array(b))
    return {"linear": round(1 / inv_lin, 4), "attention": round(1 / inv_att, 4),
            "moe_share_of_8k_prefill": round(unit.prefill_parts(8192, 0).moe / FANCY[0][2], 4)}


def main() -> None:
    rows = read(AIC / "moe_perf_qwen3_30b_a3b.csv")
    fitted_on = balanced(rows)
    fit = fit_kernel(fitted_on, QWEN)
    shipped = kernel(FUSED_MOE_H200, QWEN)
    m = MODELS["qwen3-30b-a3b"]
    power = [(r["num_tokens"], m.touched_experts(int(r["num_tokens"])), r["latency"] * 1e-3) for r in rows
             if r["distribution"] != "balanced" and r["moe_tp_size"] == 1 and r["moe_ep_size"] == 1]
    shapes: dict[Shape, list[tuple[float, float, float]]] = {}
    for r in read(AIC / "moe_perf_bf16_balanced_other_shapes.csv"):
        key: Shape = (r["hidden_size"], r["inter_size"], r["num_experts"], r["topk"])
        shapes.setdefault(key, []).append((r["num_tokens"], min(r["num_tokens"] * r["topk"], r["num_experts"]),
                                           r["latency"] * 1e-3))
    with open(LSS_MOE, newline="") as fh:
        lss = [(float(r["tokens"]), float(r["activated_experts"]), float(r["time_us"]) * 1e-6) for r in csv.DictReader(fh)]
    print(json.dumps({
        "source": str(AIC.relative_to(DATA.parent.parent)), "model_shape": dict(zip(("hidden", "width", "experts", "topk"), QWEN)),
        "fitted": {"floor_us": round(fit.floor_s * 1e6, 2), "memory": round(fit.memory, 4), "linear": round(fit.linear, 4)},
        "shipped": {"floor_us": round(FUSED_MOE_H200.floor_s * 1e6, 2), "memory": FUSED_MOE_H200.memory,
                    "linear": FUSED_MOE_H200.linear},
        "layer_us": {str(int(t)): {"measured": round(s * 1e6, 2), "fitted": round(shipped.seconds(t, e) * 1e6, 2)}
                     for t, e, s in fitted_on if t in (1, 16, 256, 2048, 16384)},
        "in_sample": errors(shipped, fitted_on),
        "held_out": {
            **{f"moe_tp{tp}": errors(shipped, balanced(rows, tp)) for tp in (2, 4)},
            "power_law_routing_at_uniform_expectation": errors(shipped, power),
            "other_bf16_shapes": {"x".join(f"{v:g}" for v in key): errors(kernel(FUSED_MOE_H200, key), pts)
                                  for key, pts in sorted(shapes.items())},
            "rtx_pro_6000_llmservingsim": errors(kernel(FUSED_MOE_H200, QWEN, gpu="rtx-pro-6000"), lss),
        },
        "moe_presets_solved": preset_solve(FUSED_MOE_H200),
    }, indent=1))


if __name__ == "__main__":
    main()
