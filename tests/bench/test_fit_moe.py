"""bench/fit_moe.py: the fused-MoE constants the presets ship are the fit of the shipped measured table."""

import pytest

from shared.moe_cost import FUSED_MOE_H200


def test_the_shipped_constants_are_what_the_fit_gives(load_bench):
    fit_moe = load_bench("fit_moe")
    fitted = fit_moe.fit_kernel(fit_moe.balanced(fit_moe.read(fit_moe.AIC / "moe_perf_qwen3_30b_a3b.csv")), fit_moe.QWEN)
    assert fitted.floor_s == pytest.approx(FUSED_MOE_H200.floor_s, abs=0.005e-6)
    assert fitted.memory == pytest.approx(FUSED_MOE_H200.memory, abs=5e-5)
    assert fitted.linear == pytest.approx(FUSED_MOE_H200.linear, abs=5e-5)
