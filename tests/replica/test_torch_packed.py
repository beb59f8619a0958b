"""One forward per step: the torch backend packs a step's prefill chunks and decoders into one
forward, whose K/V equal each sequence computed alone (to float32 rounding: see
test_torch_backend's docstring); the two-matrix MLP; the calibrator's mixed step."""

from dataclasses import replace

import pytest

from replica.core.build import CoreSettings, EngineKnobs, build_core
from replica.core.sched.scheduler import SchedRequest
from shared.costmodel import CostModel, get_model
from shared.hashing import chain_ids

torch = pytest.importorskip("torch")
F = pytest.importorskip("torch.nn.functional")

from replica.backends.calibration import Calibrator  # noqa: E402
from replica.backends.torch_backend import TorchBackend  # noqa: E402
from replica.backends.torchstack import DecodeGroup, PackedSeq, TorchStack  # noqa: E402

# one_thread: the autouse fixture (one torch thread), applied here too
from tests.replica.test_torch_backend import BS, _reference, one_thread, same_kv  # noqa: E402, F401

SPECS = {"tiny": get_model("tiny"), "tiny-moe": get_model("tiny-moe"),
         "tiny-2-matrix": replace(get_model("tiny"), mlp_matrices=2)}


def _kv_log(layers: int) -> tuple[list[tuple[torch.Tensor, torch.Tensor] | None], object]:
    log: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * layers

    def keep(layer, k, v):
        log[layer] = (k.clone(), v.clone())

    return log, keep


@pytest.mark.parametrize("name", SPECS)
def test_a_packed_forward_equals_each_sequence_alone(name):
    """Two prefill chunks (one over a cached prefix, one a single token over its prefix) and
    three decoders with contexts of different lengths (one padded, masked call), packed."""
    s = SPECS[name]
    stack = TorchStack(s, "cpu", 2, seed=3)
    g = torch.Generator().manual_seed(1)

    def rand(*shape):
        return torch.randn(shape, generator=g)

    def prefix(n):
        return [(rand(n, s.kv_heads, s.head_dim), rand(n, s.kv_heads, s.head_dim)) for _ in range(2)]

    prefills = [(rand(8, s.hidden), 0, None), (rand(5, s.hidden), 12, prefix(12)), (rand(1, s.hidden), 7, prefix(7))]
    contexts = [6, 9, 9]
    dec_x = rand(len(contexts), s.hidden)
    dec_k = [rand(len(contexts), s.kv_heads, 10, s.head_dim) for _ in range(2)]
    dec_v = [rand(len(contexts), s.kv_heads, 10, s.head_dim) for _ in range(2)]
    mask = torch.zeros((len(contexts), 10), dtype=torch.bool)
    for i, ctx in enumerate(contexts):
        mask[i, :ctx] = True
    mask[:, -1] = True
    seqs: list = []
    rows = 0
    for x, start, past in prefills:
        seqs.append(PackedSeq(slice(rows, rows + len(x)), start, None if past is None else past.__getitem__))
        rows += len(x)
    seqs.append(DecodeGroup(slice(rows, rows + len(contexts)), [k.clone() for k in dec_k], [v.clone() for v in dec_v],
                            mask[:, None, None, :]))
    positions = torch.cat([torch.arange(start, start + len(x)) for x, start, _ in prefills] + [torch.tensor(contexts)])
    packed_kv, keep = _kv_log(2)
    with torch.inference_mode():
        packed = stack.forward_packed(torch.cat([x for x, _, _ in prefills] + [dec_x]), positions, seqs, keep)
        row = 0
        for x, start, past in prefills:
            alone_kv, keep_alone = _kv_log(2)
            alone = stack.prefill(x, start, past, keep_alone)
            assert torch.allclose(packed[row:row + len(x)], alone, rtol=1e-5, atol=1e-5)
            for layer in range(2):
                for j in (0, 1):
                    assert same_kv(packed_kv[layer][j][row:row + len(x)], alone_kv[layer][j])
            row += len(x)
        for i, ctx in enumerate(contexts):  # each decoder alone, unpadded
            past_k = [torch.cat((k[i:i + 1, :, :ctx], k[i:i + 1, :, -1:]), dim=2) for k in dec_k]
            past_v = [torch.cat((v[i:i + 1, :, :ctx], v[i:i + 1, :, -1:]), dim=2) for v in dec_v]
            alone = stack.decode(dec_x[i:i + 1], torch.tensor([ctx]), past_k, past_v)
            assert torch.allclose(packed[row + i:row + i + 1], alone, rtol=1e-5, atol=1e-5)
            for layer in range(2):
                assert same_kv(seqs[-1].past_k[layer][i, :, -1], past_k[layer][0, :, -1])


def _step_log(tb: TorchBackend) -> list[tuple[int, int, int]]:
    """(requests prefilling, decoders, forwards run) of each step the backend times."""
    log: list[tuple[int, int, int]] = []
    step_time = tb.step_time

    def spy(chunks, decoders, steps, modelled):
        before = tb.counters["forwards"]
        out = step_time(chunks, decoders, steps, modelled)
        log.append((len({id(r) for r, _, _ in chunks}), len(decoders), tb.counters["forwards"] - before))
        return out

    tb.step_time = spy  # type: ignore[method-assign]
    return log


def test_a_mixed_step_runs_one_forward_and_its_blocks_equal_a_recompute():
    """A decoder, a prompt computing a shared system prompt, a prompt hitting that system prompt
    in the same step (read as the same forward writes it), and a long prompt chunked across
    steps (a chunk ends inside a block); then a hole: a middle block dropped and recomputed
    between hits."""
    cost = CostModel.from_names("tiny", "h200")
    core = build_core(CoreSettings(capacity_blocks=64, block_size=BS, reuse="off",
                                   knobs=EngineKnobs(token_budget=40, hit_mode="holes")), cost)
    tb = TorchBackend(cost.model, core.pool, "cpu", layers=2, seed=7).attach(core.scheduler)
    log = _step_log(tb)
    system = [500, 501, 502]
    prompts = {0: (chain_ids([1, 2, 3]), 3 * BS + 2, 8), 1: (chain_ids([*system, 10, 11]), 5 * BS + 3, 3),
               2: (chain_ids([*system, 20]), 4 * BS + 1, 3), 3: (chain_ids(list(range(30, 42))), 12 * BS, 3)}
    now = 0.0
    core.scheduler.submit(SchedRequest(0, *prompts[0], now))
    now += core.scheduler.step(now).duration  # request 0 prefilled: a decoder from here on
    for rid in (1, 2, 3):
        core.scheduler.submit(SchedRequest(rid, *prompts[rid], now))
    while core.scheduler.has_work():
        now += core.scheduler.step(now).duration
    c = tb.counters
    assert (3, 1, 1) in log  # three prompts and a decoder in one step: one forward
    assert all(forwards == 1 for _, _, forwards in log) and c["forwards"] == len(log)
    assert c["blocks_read"] == 3 and c["hits_not_in_slots"] == 0  # request 2's system prompt, read
    assert c["blocks_computed"] == 3 + 5 + 1 + 12
    ref = TorchStack(tb.spec, "cpu", 2, seed=7)
    expected = {}
    for hashes, _, _ in prompts.values():
        expected.update(zip(hashes, _reference(ref, hashes)))
    for h in core.pool.resident:
        assert same_kv(tb.block_kv(h), expected[h]), f"block {h:#x} differs from its recompute"
    # A hole: block 3 of request 1 dropped; request 1 again reads blocks 0-2 and 4, and computes
    # block 3 and the tail (a sequence after block 4, which reads block 3 as the forward writes it).
    hashes = prompts[1][0]
    core.pool.remove([hashes[3]])
    computed, read, steps = c["blocks_computed"], c["blocks_read"], len(log)
    core.scheduler.submit(SchedRequest(4, *prompts[1], now))
    while core.scheduler.has_work():
        now += core.scheduler.step(now).duration
    assert c["blocks_computed"] == computed + 1 and c["blocks_read"] == read + 4
    assert log[steps] == (1, 0, 1) and all(forwards == 1 for _, _, forwards in log)
    assert same_kv(tb.block_kv(hashes[3]), expected[hashes[3]])


def test_a_two_matrix_mlp_is_fc1_relu_fc2():
    s = SPECS["tiny-2-matrix"]
    stack = TorchStack(s, "cpu", 1, seed=0)
    w = stack.layers[0]
    assert w.gate_up.shape == (s.hidden, s.intermediate) and w.down.shape == (s.intermediate, s.hidden)
    assert w.gate_up.numel() + w.down.numel() == s.expert_params  # the parameters the cost model counts
    swiglu = TorchStack(SPECS["tiny"], "cpu", 1, seed=0).layers[0]
    assert swiglu.gate_up.numel() + swiglu.down.numel() == SPECS["tiny"].expert_params
    x = torch.randn(5, s.hidden)
    assert torch.equal(stack._mlp(w, x), F.relu(x @ w.gate_up) @ w.down)


def test_the_calibrators_mixed_step_is_one_packed_forward():
    cal = Calibrator(get_model("tiny"), "cpu", 2, repeats=1)
    fn = cal.step_fn([(16, 0), (8, 32)], [20, 40, 40])
    calls = []
    forward = cal.stack.forward_packed

    def counted(*args, **kw):
        calls.append(args[0].shape[0])
        return forward(*args, **kw)

    cal.stack.forward_packed = counted  # type: ignore[method-assign]
    with torch.inference_mode():
        out = fn()
    assert calls == [16 + 8 + 3] and out.shape == (27, 256) and torch.isfinite(out).all()
    assert cal.time(fn) > 0
    cal.step_fn([(4, 32)], [20, 40, 40])  # the same prefix and decoder tensors, shared
    assert set(cal._past) == {0, 32} and len(cal._decode_pasts) == 1
    with torch.inference_mode():  # the single-shape calls still run
        assert cal.prefill_fn(8, 16)().shape == (8, 256) and cal.decode_fn(2, 12)().shape == (2, 256)
