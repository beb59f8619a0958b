"""The prefill model against real device measurements: old form vs new form, per point.

Reads docs/calibration/h200-llama-3-8b.json (llama-3-8b's layer stack on one H200, see
docs/calibration.md) and prints JSON: per point the measured seconds, the old model's (one
linear and one attention efficiency, calibrated on When Fancy Eviction Fails' MoE measurement, no prefix-read term), the
shipped preset's (the step form with the dense H200 efficiencies; a prefill alone is a step of one chunk), a fresh fit on all points,
and a leave-one-out fit (each point predicted by a fit on the others: the honest figure
for how the form carries to points it was not fitted on). Errors are predicted / measured - 1.

    .venv/bin/python bench/bench_costmodel_fit.py
"""

from __future__ import annotations

import json
from pathlib import Path

from shared.costfit import PrefillPoint, errors, fit
from shared.costmodel import CostModel

DATA = Path(__file__).resolve().parent.parent / "docs" / "calibration" / "h200-llama-3-8b.json"


def old_model(cost: CostModel, n: int, c: int) -> float:
    """The form before issue 14: 2 x active params per token at 0.47 of peak, attention at 0.53."""
    m = cost.model
    linear = 2.0 * 8.03e9 * n
    attn = 4.0 * m.q_heads * m.head_dim * m.layers * (n * c + n * (n - 1) / 2)
    return linear / (cost.gpu.peak_flops * 0.47) + attn / (cost.gpu.peak_flops * 0.53)


def main() -> None:
    raw = json.loads(DATA.read_text())
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
    }, indent=1))


if __name__ == "__main__":
    main()
