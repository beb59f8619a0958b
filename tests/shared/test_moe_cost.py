"""The fused-MoE layer (shared/moe_cost.py): a measured table interpolated, and the presets' fitted form."""

import json

import pytest

from shared.costmodel import CostModel, Efficiency, StepWork, get_gpu, get_model
from shared.devprofile import DeviceProfile, load_profile, save_profile
from shared.errors import InputError
from shared.moe_cost import FUSED_MOE_H200, MoeTable

EXPERT_BYTES = 3 * 2048 * 768 * 2  # one Qwen3-30B-A3B expert: gate, up, down in bf16, 9,437,184 bytes
TOKEN_FLOPS = 2 * 8 * 3 * 2048 * 768  # one token's products over its 8 experts, 75,497,472 FLOPs


def test_a_two_row_table_is_linear_between_its_rows_and_beyond_them():
    table = MoeTable.of([[8, 8, 50.0], [24, 8, 90.0]])
    assert table.us_at(12, 8) == 60.0  # a quarter of the way: 50 + 40 / 4
    assert table.us_at(40, 8) == 130.0  # beyond: the two rows' slope, 2.5 us a token
    assert table.us_at(12, 100) == 60.0  # one expert count profiled: every count reads it
    # two expert counts: first along tokens at each, then across them
    two = MoeTable.of([(8, 8, 50.0), (24, 8, 90.0), (8, 16, 130.0), (24, 16, 170.0)])
    assert two.us_at(12, 12) == 100.0  # 60 at 8 experts, 140 at 16: halfway
    assert two.token_slope_us() == 2.5


def test_a_profile_table_prices_the_steps_moe_layers_and_survives_the_profiles_json(tmp_path):
    m = get_model("qwen3-30b-a3b")
    rows = ((1.0, 8.0, 40.0), (2.0, 8.0, 50.0), (2.0, 16.0, 80.0))
    eff = Efficiency(moe_table=rows)
    cost = CostModel(m, get_gpu("h200"), eff)
    # one decoder: 1 token over 8 experts, 40 us a layer, 48 layers
    assert cost.step_parts(StepWork(decoders=1)).moe == pytest.approx(48 * 40e-6, rel=1e-12)
    # at --tp 2 a GPU holds half of every expert: half a token over 4 experts' worth, the table extended: 35 us
    # at 8 experts (40 - 10 / 2), 80 at 16 (its one row), so 35 - 45 / 2 = 12.5 us at 4
    tp2 = CostModel(m, get_gpu("h200"), eff, tp=2)
    assert tp2.step_parts(StepWork(decoders=1)).moe == pytest.approx(48 * 12.5e-6, rel=1e-12)
    path = tmp_path / "p.json"
    save_profile(DeviceProfile(get_gpu("h200"), {"qwen3-30b-a3b": eff}), str(path))
    assert json.loads(path.read_text())["models"]["qwen3-30b-a3b"]["moe_table"][0] == [1.0, 8.0, 40.0]
    assert load_profile(str(path)).models["qwen3-30b-a3b"].moe_table == rows


def test_the_presets_moe_layer_is_the_fitted_form_at_1_and_2048_tokens():
    """17.04 us a layer, then 0.822 of the H200's 4.8 TB/s for the touched experts or 0.4459 of its 989 TFLOP/s
    for the tokens' products, whichever is slower (bench/fit_moe.py)."""
    assert FUSED_MOE_H200 == (17.04e-6, 0.822, 0.4459)
    cost = CostModel.from_names("qwen3-30b-a3b", "h200")
    one = 17.04e-6 + 8 * EXPERT_BYTES / (0.822 * 4.8e12)  # weight-bound: 36.17 us
    assert cost.moe_layer_s(1, 8) == pytest.approx(one, rel=1e-12)
    assert cost.moe_layer_s(1, 8) == pytest.approx(36.1746e-6, abs=1e-10)
    full = 17.04e-6 + 2048 * TOKEN_FLOPS / (0.4459 * 989e12)  # 2,048 tokens over 128 experts: compute-bound
    assert cost.moe_layer_s(2048, 128) == pytest.approx(full, rel=1e-12)
    assert 128 * EXPERT_BYTES / (0.822 * 4.8e12) < full - 17.04e-6
    # a decode step of one sequence: 48 such layers beside the rest of the step
    assert cost.step_parts(StepWork(decoders=1)).moe == pytest.approx(48 * one, rel=1e-12)


@pytest.mark.parametrize("rows, said", [
    ([[1, 8]], "row 0: [1, 8] is not [tokens, experts, microseconds]"),
    ([[0, 8, 5.0]], "tokens and experts must be >= 1"),
    ([[1, 8, 5.0], [1.0, 8, 6.0]], "row 1: 1 tokens over 8 experts is given twice"),
])
def test_a_bad_table_is_refused_naming_the_row(rows, said):
    with pytest.raises(InputError, match="moe_table") as exc:
        Efficiency(moe_table=rows)
    assert said in str(exc.value)
