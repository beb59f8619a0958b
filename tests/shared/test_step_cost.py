"""One forward per step: hand-worked step prices and invariants over random batches."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.costmodel import CostModel, Efficiency, StepWork, get_gpu, get_model, layered_finish

LLAMA = CostModel.from_names("llama-3-8b", "h200")


def attention_unit(cm: CostModel) -> float:
    m = cm.model
    return 4 * m.q_heads * m.head_dim * m.layers / (cm.gpu.peak_flops * cm.efficiency.attention)


def test_sixteen_chunks_of_64_cost_one_forward_of_1024_less_the_attention_they_skip():
    one = LLAMA.prefill_parts(1024, 0)
    sixteen = LLAMA.step_parts(StepWork.of([(64, 0)] * 16))
    assert sixteen.weights == one.weights and sixteen.linear == one.linear and sixteen.overhead == one.overhead
    skipped = (1024 * 1023 / 2 - 16 * 64 * 63 / 2) * attention_unit(LLAMA)  # 523,776 - 32,256 pairs
    assert one.attention - sixteen.attention == pytest.approx(skipped)
    # the LM head runs once a sequence: 15 more rows of it, 2 x 128,256 x 4,096 FLOPs each
    head_row = 2 * 128256 * 4096 / (989e12 * LLAMA.efficiency.linear)
    assert sixteen.head - one.head == pytest.approx(15 * head_row)
    assert LLAMA.step_time(StepWork.of([(64, 0)] * 16)) == pytest.approx(
        LLAMA.prefill_time(1024) - skipped + 15 * head_row)
    # each priced as its own forward (the old clock) they cost 16 weight reads and 16 overheads
    assert 16 * LLAMA.prefill_time(64) > 2.5 * LLAMA.step_time(StepWork.of([(64, 0)] * 16))


def test_a_chunk_rides_along_a_weight_bound_decode_step():
    decode = StepWork(decoders=32, decode_kv=32 * 1024)
    mixed = StepWork.of([(64, 0)], decoders=32, decode_kv=32 * 1024)
    alone, both = LLAMA.step_time(decode), LLAMA.step_time(mixed)
    assert LLAMA.step_parts(mixed).memory_side > LLAMA.step_parts(mixed).compute_side  # weight-bound
    assert alone < both < 1.03 * alone
    # what the chunk adds is its attention (64 x 63 / 2 pairs), nothing else: 96 tokens <= 512 replay a graph
    assert both - alone == pytest.approx(64 * 63 / 2 * attention_unit(LLAMA))
    assert both < alone + LLAMA.prefill_time(64) / 20  # not a second forward


def test_moe_layers_read_the_experts_the_union_of_the_steps_tokens_touches():
    cm = CostModel.from_names("qwen3-coder-30b-a3b", "h200")
    m = cm.model
    bw = 4.8e12 * cm.efficiency.memory
    base = (m.layers * m.layer_params(0) + m.vocab * m.hidden) * 2 / bw  # the weights but the routed experts
    step = StepWork.of([(3, 0), (2, 10)], decoders=4, decode_kv=0)  # 9 tokens in all
    touched = 128 * (1 - (1 - 8 / 128) ** 9)
    assert cm.step_parts(step).weights == pytest.approx(base)
    # the fused-MoE layers: 17.04 us each and the touched experts at 0.822 x 4.8 TB/s (weight-bound at 9 tokens)
    assert cm.step_parts(step).moe == pytest.approx(48 * (17.04e-6 + touched * m.expert_params * 2 / (0.822 * 4.8e12)))
    # more than the 8 experts one token touches, fewer than 9 x 8 (tokens share experts)
    assert 8 < touched < 72
    # separately, a 5-token prefill and a 4-decoder step read experts for 5 and for 4 tokens
    assert cm.step_parts(step).moe < cm.prefill_parts(5, 0).moe + cm.step_parts(StepWork(decoders=4)).moe


def test_a_restore_inside_the_step_adds_nothing_and_one_outside_only_what_is_left():
    # 32 layers, 10 ms of compute: 0.3125 ms a layer
    assert layered_finish(0.010, [], 32) == 0.010
    # started 5 ms before the step, done 5 ms into it: layer 1 was in before the step, layer 32
    # is in with 5 ms of compute to go
    assert layered_finish(0.010, [(-0.005, 0.005)], 32) == 0.010
    # done 20 ms in: the step ends one layer of compute after it
    assert layered_finish(0.010, [(-0.005, 0.020)], 32) == pytest.approx(0.020 + 0.010 / 32)
    # started with the step: the first layer's share (1/32 of 8 ms) comes before any compute
    assert layered_finish(0.010, [(0.0, 0.008)], 32) == pytest.approx(0.008 / 32 + 0.010)
    # several: the latest bound wins
    assert layered_finish(0.010, [(-0.005, 0.005), (-0.001, 0.030)], 32) == pytest.approx(0.030 + 0.010 / 32)


steps = st.builds(
    lambda chunks, dec, ctx: StepWork.of(chunks, dec, dec * ctx),
    st.lists(st.tuples(st.integers(1, 4096), st.integers(0, 65536)), max_size=6),
    st.integers(0, 256), st.integers(0, 32768))


@settings(max_examples=200, deadline=None)
@given(steps, st.sampled_from(["llama-3-8b", "qwen3-coder-30b-a3b", "opt-13b"]),
       st.sampled_from(["h200", "a100-80gb@tp2"]))
def test_a_step_never_costs_less_than_its_weight_read_or_its_flops_and_grows_with_every_input(work, model, gpu):
    cm = CostModel.from_names(model, gpu)
    t = cm.step_time(work)
    if work.tokens == 0:
        assert t == 0.0
        return
    p = cm.step_parts(work)
    assert t == pytest.approx(p.total, rel=1e-12)
    assert t >= p.weights and t >= p.linear + p.attention
    for more in (work._replace(prefill_tokens=work.prefill_tokens + 1, prefill_seqs=max(work.prefill_seqs, 1)),
                 work._replace(attn_pairs=work.attn_pairs + 1000), work._replace(cached_tokens=work.cached_tokens + 16),
                 work._replace(decoders=work.decoders + 1), work._replace(decode_kv=work.decode_kv + 1024)):
        assert cm.step_time(more) >= t


def test_step_inputs_are_checked():
    with pytest.raises(ValueError, match="new_tokens"):
        StepWork.of([(-1, 0)])
    with pytest.raises(ValueError, match="decoders"):
        StepWork.of([], decoders=-1)
    assert StepWork.of([(0, 100)]) == StepWork()  # an empty chunk is no sequence
    with pytest.raises(ValueError, match="graph_tokens"):
        Efficiency(graph_tokens=-1)
    assert CostModel(get_model("tiny"), get_gpu("h200")).step_time(StepWork()) == 0.0
