"""``kvemu calibrate --from-profile DIR``: a device profile from a published operator profile.

No device and no torch: the profile's operator times (LLMServingSim's layout, or Vidur's) are
summed into whole steps as that simulator sums them (shared/profiles_llmservingsim.py,
shared/profiles_vidur.py), the step form of the cost model is fitted to those steps
(shared/costfit.py) with each kind weighed by ``--kind-weights``, the fit error is printed by
kind, and the profile is written in the format ``--gpu FILE`` / ``--gpu-file FILE`` loads.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace

import numpy as np

from shared import profiles_llmservingsim as lss
from shared.costfit import StepPoint, fit
from shared.costmodel import CostModel, GpuSpec, ModelSpec, get_gpu, get_model
from shared.devprofile import DeviceProfile, is_profile_path, load_profile, merged_profile, save_profile
from shared.errors import InputError, KvemuError
from shared.gpu_presets import GPUS
from shared.profiles_vidur import is_vidur, read_vidur

KINDS = ("prefill", "decode", "mixed")
METHOD = ("each step of the profile's grid (attention.csv: prefill chunk and its KV, decoders and each one's KV) "
          "priced as the profile's simulator sums its operators: the embedding and final norm once, every "
          "operator of one profiled layer times the model's layers, the LM head and sampler once over the "
          "step's sequences; kept where a serving run of the profiled engine could run it (its "
          "max_num_batched_tokens and max_num_seqs, KV within the GPU's capacity). The times are kernel times "
          "(no launch gaps, no CPU), so no step is priced as a CUDA graph's (graph_tokens 0): steps that prefill "
          "pay overhead_s a layer, decode-only steps decode_overhead_s. Fitted by weighted least squares on "
          "the relative error, each kind's points sharing its weight (docs/calibration.md)")


def parse_weights(text: str) -> dict[str, float]:
    """``"prefill=0.05,decode=0.75,mixed=0.2"`` -> the shares, normalised to sum to 1."""
    weights: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        kind, sep, value = part.partition("=")
        try:
            w = float(value)
        except ValueError:
            w = -1.0
        if not sep or kind.strip() not in KINDS or not 0 <= w < float("inf"):
            raise InputError("--kind-weights", f"{part!r}: expected KIND=W with KIND one of {', '.join(KINDS)} "
                                               "and W a number >= 0")
        weights[kind.strip()] = w
    if sum(weights.values()) <= 0:
        raise InputError("--kind-weights", f"{text!r}: give some kind a weight > 0")
    return {k: weights.get(k, 0.0) / sum(weights.values()) for k in KINDS}


def _alnum(text: str) -> str:
    return "".join(c for c in text.lower() if c.isalnum())


def _inferred_gpu(labels: tuple[str, ...]) -> str:
    """The preset a profile's device labels name (``RTX4090``, ``NVIDIA GeForce RTX 4090``: ``rtx-4090``), or ''."""
    presets = {_alnum(name): name for name in GPUS}
    for label in labels:
        key = _alnum(label.replace("NVIDIA", "").replace("GeForce", ""))
        if key in presets:
            return presets[key]
    return ""


def _named(args, meta_gpu: tuple[str, ...], meta_model: str) -> tuple[GpuSpec, ModelSpec]:
    """The GPU (a preset, or a device profile's rates) and the model; by default the profile's own names."""
    gpu_name = args.gpu or _inferred_gpu(meta_gpu)
    model_name = args.model or meta_model.rsplit("/", 1)[-1].lower()
    if not gpu_name:
        raise InputError("--gpu", f"no preset is named like the profile's device ({' / '.join(meta_gpu)}): name the "
                                  "card it was measured on, a preset or a device profile file with its datasheet rates")
    try:
        gpu = load_profile(gpu_name).gpu if is_profile_path(gpu_name) else get_gpu(gpu_name)
    except KvemuError as exc:
        raise InputError("--gpu", str(exc)) from None
    try:
        model = get_model(model_name)
    except KvemuError as exc:
        said = "" if args.model else f" (the profile is of {meta_model!r}: name its preset or config.json with --model)"
        raise InputError("--model", f"{exc}{said}") from None
    return gpu, model


def _llmservingsim(args, tp: int) -> tuple[GpuSpec, ModelSpec, dict[str, list[StepPoint]], dict]:
    profile = lss.read_profile(args.from_profile, tp)
    labels = tuple(str(profile.meta[k]) for k in ("hardware", "gpu") if profile.meta.get(k))
    gpu, spec = _named(args, labels, str(profile.meta.get("model", "")))
    lss.check_model(profile, spec)
    budget, max_seqs = profile.limits
    eng = profile.meta.get("engine_effective") or {}
    block = int(eng.get("block_size") or 16)
    cost = CostModel(spec, gpu, tp=tp)
    blocks = cost.kv_budget(float(eng.get("gpu_memory_utilization") or 0.9), budget, max_seqs, block).blocks
    points = lss.steps(profile, spec, blocks * block)
    info = {"format": "llmservingsim", "folder": profile.folder, "device": profile.device,
            "profiled_model": profile.meta.get("model"), "vllm_version": profile.meta.get("vllm_version"),
            "kv_capacity_tokens": blocks * block, "skew": summary(lss.skew_errors(profile, blocks * block))}
    if spec.moe and profile.moe is not None:  # the MoE layer as measured: the profile prices it from the table
        info["moe_table"] = tuple(tuple(row) for row in profile.moe.tolist())
    return gpu, spec, points, info


def _vidur(args, tp: int) -> tuple[GpuSpec, ModelSpec, dict[str, list[StepPoint]], dict]:
    if not args.gpu or not args.model:
        raise InputError("--gpu" if not args.gpu else "--model", "Vidur's profiles hold several GPUs and models: "
                                                                 "name both with --gpu and --model")
    gpu, spec = _named(args, (), "")
    points = read_vidur(args.from_profile, gpu.name, spec.name, tp)
    info = {"format": "vidur", "folder": args.from_profile, "device": gpu.name,
            "note": "layers only: no attention, no LM head (Vidur's attention profiles are not in its repository)"}
    return gpu, replace(spec, vocab=0), {**points, "mixed": []}, info


def run_from_profile(args) -> int:
    tp = args.tp
    if not isinstance(tp, int) or tp < 1:
        raise InputError("--tp", f"must be an integer >= 1, got {tp!r}")
    shares = parse_weights(args.kind_weights)
    if not os.path.isdir(args.from_profile):
        raise InputError("--from-profile", f"{args.from_profile}: no such folder")
    read = _vidur if is_vidur(args.from_profile) else _llmservingsim
    gpu, spec, points, info = read(args, tp)
    cost = CostModel(spec, gpu, tp=tp)
    moe_table = info.pop("moe_table", cost.efficiency.moe_table)
    cost = cost.with_efficiency(replace(cost.efficiency, graph_tokens=0, source="", moe_table=moe_table))
    # the profile ran one GPU a rank: its steps have no all-reduce, so add the model's own (the fit
    # takes it out again as known; kvemu prices it from the link)
    points = {k: [replace(p, seconds=p.seconds + cost.step_parts(p.work).comm) for p in v] for k, v in points.items()}
    fitted_kinds = [k for k in KINDS if points.get(k) and shares[k] > 0]
    if not fitted_kinds:
        raise InputError("--kind-weights", "no kind with points has a weight > 0")
    steps = [p for k in fitted_kinds for p in points[k]]
    weights = np.concatenate([np.full(len(points[k]), shares[k] / len(points[k])) for k in fitted_kinds])
    source = f"{info['format']} operator profile {info['folder']} ({info['device']}, tp {tp})"
    eff = fit(cost, steps, source, weights=weights / weights.mean())
    fitted = cost.with_efficiency(eff)
    errors = {k: summary([fitted.step_time(p.work) / p.seconds - 1 for p in points[k]]) for k in KINDS if points.get(k)}
    _print(errors, shares, info, eff)
    model = spec.name
    out = args.out or f"profile-{gpu.name}-{model}.json"
    extra = {"device": info["device"], "method": METHOD if info["format"] == "llmservingsim" else info["note"],
             "calibrated": {model: {**{k: v for k, v in info.items() if k != "skew"}, "tp": tp,
                                    "kind_weights": shares, "layers": spec.layers}},
             "fit_errors": {model: {**errors, **({"skew_attention": info["skew"]} if info.get("skew", {}).get("points") else {})}}}
    save_profile(merged_profile(out, DeviceProfile(gpu, {model: eff}, extra)), out)
    print(f"wrote {out}: use it as --gpu-file {out} (with --model {model})")
    return 0


def summary(rel: list[float]) -> dict:
    """Relative errors (model / profile - 1): how many, mean and quantiles of their magnitude, signed mean."""
    if not rel:
        return {"points": 0}
    a = np.abs(np.array(rel))
    return {"points": len(rel), "mean_abs": round(float(a.mean()), 4), "median_abs": round(float(np.median(a)), 4),
            "p90_abs": round(float(np.quantile(a, 0.9)), 4), "max_abs": round(float(a.max()), 4),
            "mean": round(float(np.mean(rel)), 4)}


def _print(errors: dict, shares: dict, info: dict, eff) -> None:
    out = sys.stdout
    out.write(f"{'kind':>8} {'points':>7} {'weight':>7} {'mean|err|':>10} {'median':>8} {'p90':>8} {'max':>8} "
              f"{'signed':>8}\n")
    for kind, e in errors.items():
        out.write(f"{kind:>8} {e['points']:>7} {shares[kind]:>7.2f} {e['mean_abs']:>10.1%} {e['median_abs']:>8.1%} "
                  f"{e['p90_abs']:>8.1%} {e['max_abs']:>8.1%} {e['mean']:>+8.1%}\n")
    if info.get("skew", {}).get("points"):
        s = info["skew"]
        out.write(f"{'skew':>8} {s['points']:>7} {'-':>7} {s['mean_abs']:>10.1%} {s['median_abs']:>8.1%} "
                  f"{s['p90_abs']:>8.1%} {s['max_abs']:>8.1%} {s['mean']:>+8.1%}  (attention only, held out: uneven "
                  "decode contexts priced at their mean)\n")
    out.write(json.dumps({"fit_errors": errors, "efficiency": {
        "linear": round(eff.linear, 4), "attention": round(eff.attention, 4), "kv_read": round(eff.kv_read, 4),
        "memory": round(eff.memory, 4), "decode_kv": eff.decode_kv, "decode_linear": eff.decode_linear,
        "overhead_s": eff.overhead_s, "decode_overhead_s": eff.decode_overhead_s, "decode_seq_s": eff.decode_seq_s,
        "graph_tokens": eff.graph_tokens}}) + "\n")
