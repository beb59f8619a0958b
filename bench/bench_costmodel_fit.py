"""The prefill model against real device measurements: old form vs new form, per point.

Reads docs/calibration/h200-llama-3-8b.json (llama-3-8b's layer stack on one H200, see
docs/calibration.md) and prints JSON: per point the measured seconds, the old model's (one
linear and one attention efficiency, calibrated on When Fancy Eviction Fails' MoE measurement, no prefix-read term), the
shipped preset's (the step form with the dense H200 efficiencies; a prefill alone is a step of one chunk), a fresh fit on all points,
and a leave-one-out fit (each point predicted by a fit on the others: the honest figure
for how the form carries to points it was not fitted on). Errors are predicted / measured - 1.

    .venv/bin/python bench/bench_costmodel_fit.py [--decode SWEEP.json]

``--decode``: a file of ``bench_step_cost.py --device cuda --decode-sweep``; its decode points
take the place of the calibration file's (priced at the layers it ran).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from shared.costfit import PrefillPoint, errors, fit
from shared.costmodel import CostModel, GpuSpec, get_model

DATA = Path(__file__).resolve().parent.parent / "docs" / "calibration" / "h200-llama-3-8b.json"


def old_model(cost: CostModel, n: int, c: int) -> float:
    """The form before issue 14: 2 x active params per token at 0.47 of peak, attention at 0.53."""
    m = cost.model
    linear = 2.0 * 8.03e9 * n
    attn = 4.0 * m.q_heads * m.head_dim * m.layers * (n * c + n * (n - 1) / 2)
    return linear / (cost.gpu.peak_flops * 0.47) + attn / (cost.gpu.peak_flops * 0.53)


def decode_forms(cost: CostModel) -> dict[str, CostModel | None]:
    """The decode step's forms side by side: before the last round (every resident weight read, the
    input embedding too, and no fixed cost), the last round's (the LM head, no input embedding, a
    graph replay free), and the shipped preset (a graph replay's kernel gaps, 5.5 us a layer)."""
    last = cost.with_efficiency(replace(cost.efficiency, decode_overhead_s=0.0))
    return {"before_last_round": None, "last_round": last, "preset": cost}


def decode_time(form: CostModel | None, cost: CostModel, batch: int, context: int) -> float:
    if form is not None:
        return form.decode_step_time(batch, batch * context)
    m, e = cost.model, cost.efficiency  # all resident weights and the batch's KV at `memory`, nothing else
    return (m.weight_bytes + batch * context * m.kv_bytes_per_token) / (cost.gpu.hbm_bandwidth * e.memory)


def decode_section(raw: dict, cost: CostModel) -> dict:
    """Each form's price of the decode sweep's shapes; against the file's decode points when it has
    them (``bench_step_cost.py --device cuda --decode-sweep`` writes them), else beside the one
    device figure at hand: issue 41's report that the last round's form was 12% under a real
    H200 at batch 1 (1K and 8K context), i.e. the device at last_round / 0.88 (inferred, not measured)."""
    points = raw.get("decode") or [{"batch": b, "context": c} for b in (1, 4, 16, 64) for c in (1024, 8192)]
    forms = decode_forms(cost)
    rows = []
    for p in points:
        row = dict(p)
        for name, form in forms.items():
            t = decode_time(form, cost, p["batch"], p["context"])
            row[name + "_s"] = round(t, 6)
            if "seconds" in p:
                row[name + "_error"] = round(t / p["seconds"] - 1, 4)
            elif p["batch"] == 1:
                device = decode_time(forms["last_round"], cost, 1, p["context"]) / 0.88
                row["issue_41_device_s"] = round(device, 6)
                row[name + "_vs_issue_41"] = round(t / device - 1, 4)
        rows.append(row)
    return {"measured": "decode" in raw, "points": rows}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--decode", default=None, help="a decode sweep's JSON (bench_step_cost.py --decode-sweep)")
    args = ap.parse_args(argv)
    raw = json.loads(DATA.read_text())
    decode_raw, decode_cost = raw, None
    if args.decode:  # the sweep's model at the layers it ran, on its GPU's preset
        decode_raw = json.loads(Path(args.decode).read_text())
        decode_cost = CostModel(replace(get_model(decode_raw["model"]), layers=decode_raw["layers"]),
                                GpuSpec(**decode_raw["preset_gpu"]))
    points = [PrefillPoint(p["new_tokens"], p["cached_depth"], p["seconds"]) for p in raw["prefill"]]
    measured = [p.seconds for p in points]
    cost = CostModel.from_names(raw["model"], "h200")
    fitted = cost.with_efficiency(fit(cost, points))
    loo = []
    for i, p in enumerate(points):
        rest = points[:i] + points[i + 1:]
        loo.append(cost.with_efficiency(fit(cost, rest)).prefill_time(p.new_tokens, p.cached_depth))
    forms = {
        "old": [old_model(cost, p.new_tokens, p.cached_depth) for p in points],
        "new_preset": [cost.prefill_time(p.new_tokens, p.cached_depth) for p in points],
        "new_fit_all": [fitted.prefill_time(p.new_tokens, p.cached_depth) for p in points],
        "new_leave_one_out": loo,
    }
    e = fitted.efficiency
    print(json.dumps({
        "data": str(DATA.relative_to(DATA.parent.parent.parent)), "device": raw["device"], "model": raw["model"],
        "points": [{"new_tokens": p.new_tokens, "cached_depth": p.cached_depth, "measured_s": p.seconds,
                    **{k: round(v[i], 5) for k, v in forms.items()}} for i, p in enumerate(points)],
        "errors": {k: errors(v, measured) for k, v in forms.items()},
        "fitted_efficiency": {"linear": round(e.linear, 4), "attention": round(e.attention, 4),
                              "kv_read": round(e.kv_read, 4),
                              "overhead_s": e.overhead_s},
        "decode": decode_section(decode_raw, decode_cost or cost),
    }, indent=1))


if __name__ == "__main__":
    main()
