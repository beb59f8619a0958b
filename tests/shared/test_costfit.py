"""The step fit: it recovers the forms it was given (a GPU's, a CPU's, mixed steps)."""

import pytest

from shared.costfit import CAP, DecodePoint, PrefillPoint, StepPoint, fit
from shared.costmodel import CostModel, Efficiency, GpuSpec, get_gpu, get_model

GPU_GRID = [(b, b * t) for b in (1, 8, 32, 128) for t in (1024, 8192)]


def test_the_fit_cannot_tell_the_h200_weight_read_from_its_graph_replay_cost():
    """Steps priced by the shipped llama-3-8b preset on an H200 (weights + KV at 80% of HBM
    bandwidth, 5.5 us a layer of graph replay) fit back exactly, with no per-sequence term; a dense
    model reads the same weights every step, so the read takes the fixed cost in (docs/calibration.md)."""
    preset = CostModel.from_names("llama-3-8b", "h200")
    points = [DecodePoint(b, kv, preset.decode_step_time(b, kv)) for b, kv in GPU_GRID]
    start = preset.with_efficiency(Efficiency(memory=0.5, decode_overhead_s=1e-4))  # a wrong prior
    eff = fit(start, points)
    # 32 layers and the LM head, 15.01 GB: 3.9087 ms at 0.80 x 4.8 TB/s, + 32 x 5.5 us = 4.0847 ms
    read = (32 * 218_103_808 + 128256 * 4096) * 2
    assert eff.memory == pytest.approx(read / 4.8e12 / (read / (0.8 * 4.8e12) + 32 * 5.5e-6))  # 0.7655
    assert eff.decode_kv == pytest.approx(0.80)
    assert eff.decode_seq_s == pytest.approx(0.0, abs=1e-12) and eff.decode_overhead_s == pytest.approx(0.0, abs=1e-12)
    assert eff.decode_linear is None  # the products stay on the roofline's compute side
    fitted = start.with_efficiency(eff)
    for p in points:
        assert fitted.decode_step_time(p.batch, p.kv_tokens) == pytest.approx(p.seconds, rel=1e-9)


def test_the_fit_takes_a_cpu_step_as_reads_plus_a_cost_per_sequence():
    """Hand-worked CPU-like steps of `tiny` (4 layers, 1,024 KV bytes a token; a step reads its
    4 layers and its LM head, 4,456,448 bytes) on a device of 10 GB/s: 200 us + 25 us a
    sequence + 0.2 us a KV token."""
    gpu = GpuSpec("cpu", 100e9, 10e9, 1e9)
    cost = CostModel(get_model("tiny"), gpu)
    m = cost.model
    assert m.kv_bytes_per_token == 1024 and (m.layers * m.layer_params() + m.vocab * m.hidden) * 2 == 4_456_448
    grid = [(b, b * t) for b in (1, 4, 16) for t in (128, 512)]
    points = [DecodePoint(b, kv, 200e-6 + 25e-6 * b + 0.2e-6 * kv) for b, kv in grid]
    eff = fit(cost, points)
    # the constant is the weight read (a dense model reads the same weights every step): 445.6 us
    # at efficiency 1 -> 2.23; KV 102.4 ns a token at efficiency 1 -> 0.512; 25 us over 4 layers
    assert eff.memory == pytest.approx(4_456_448 / 10e9 / 200e-6)
    assert eff.decode_kv == pytest.approx(0.512)
    assert eff.decode_seq_s == pytest.approx(6.25e-6) and eff.decode_overhead_s == 0.0
    # the products are paid per sequence, not overlapped with the reads (at the prefill's 0.64
    # they would outlast the reads at batch 16 and price the step too high)
    assert eff.decode_linear == CAP
    fitted = cost.with_efficiency(eff)
    for p in points:
        assert fitted.decode_step_time(p.batch, p.kv_tokens) == pytest.approx(p.seconds, rel=1e-9)


def test_mixed_steps_fit_back_the_efficiencies_that_priced_them():
    """Prefill alone, decode alone and mixed steps of llama-3-8b priced by a known step form
    (eager above 128 tokens, as a calibrated GPU): the fit recovers every term."""
    truth = Efficiency(0.55, 0.30, 0.25, 0.75, 4e-5, 0.0, "truth", graph_tokens=128)
    priced = CostModel(get_model("llama-3-8b"), get_gpu("h200"), truth)
    shapes = [(((512, 0),), ()), (((1024, 0),), ()), (((4096, 0),), ()), (((8192, 16384),), ()), (((512, 65536),), ()),
              ((), (1024,) * 8), ((), (8192,) * 32), ((), (1024,) * 128),
              (((512, 0),), (2048,) * 64), (((64, 0),) * 16, ()), (((256, 4096),) * 4, (1024,) * 16)]
    points = [StepPoint(c, d, priced.step_time(StepPoint(c, d, 1.0).work)) for c, d in shapes]
    start = priced.with_efficiency(Efficiency(0.6, 0.4, 0.2, 0.8, 0.0, 0.0, graph_tokens=128))
    eff = fit(start, points)
    for name in ("linear", "attention", "kv_read", "memory", "overhead_s"):
        assert getattr(eff, name) == pytest.approx(getattr(truth, name), rel=1e-6), name
    fitted = start.with_efficiency(eff)
    for p in points:
        assert fitted.step_time(p.work) == pytest.approx(p.seconds, rel=1e-9)


def test_prefill_points_alone_keep_the_prior_memory_efficiency():
    cost = CostModel.from_names("llama-3-8b", "h200")
    points = [PrefillPoint(n, c, cost.prefill_time(n, c)) for n, c in ((1024, 0), (4096, 0), (2048, 32768), (512, 65536))]
    eff = fit(cost, points)
    assert eff.memory == cost.efficiency.memory  # no point was weight-bound: nothing saw the read
    # four points, five terms (512 new tokens replay a graph: its fixed cost is its own): exact on
    # every point, the products' efficiency within 0.1%
    assert eff.linear == pytest.approx(cost.efficiency.linear, rel=1e-3)
    fitted = cost.with_efficiency(eff)
    for p in points:
        assert fitted.prefill_time(p.new_tokens, p.cached_depth) == pytest.approx(p.seconds, rel=1e-6)


def test_decode_terms_beyond_the_roofline_hand_worked():
    """llama-3-8b on an H200, batch 4 holding 8,192 KV tokens of 131,072 bytes each."""
    m, g = get_model("llama-3-8b"), get_gpu("h200")
    base = CostModel(m, g)
    eff = Efficiency(memory=0.8, decode_kv=0.4, decode_seq_s=1e-6, decode_overhead_s=2e-6)
    cm = CostModel(m, g, eff)
    weights = (m.layers * m.layer_params() + m.vocab * m.hidden) * 2 / (4.8e12 * 0.8)
    kv = 8192 * 131_072 / (4.8e12 * 0.4)
    assert m.kv_bytes_per_token == 131_072
    assert cm.decode_step_time(4, 8192) == pytest.approx(weights + kv + 4 * 32 * 1e-6 + 32 * 2e-6)
    # the preset's (None, 0) are the H200 form: weights and KV both at `memory`, and a graph
    # replay's 11 kernel nodes at 0.5 us a layer
    assert base.decode_step_time(4, 8192) == pytest.approx(weights + 8192 * 131_072 / (4.8e12 * 0.8) + 32 * 5.5e-6)
    with pytest.raises(ValueError, match="decode_kv"):
        Efficiency(decode_kv=0.0)
