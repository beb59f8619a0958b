"""The torch backend: real K/V in a paged tensor, equal to a from-scratch recompute (to float32
rounding), one forward per step, same hits as emulated.

Not bit for bit: a step runs one forward over the packed tokens of all its sequences, and
the rounding of a row of a matrix product depends on how many rows the product has (the
GEMM kernel and its reduction order follow the batch shape; one row may take a gemv path),
as attention over a longer run of queries rounds each query differently. So a block's K/V
depend, in the last bits, on what else its step packed: float32 differences are ~1e-6. The
check compares with rtol = atol = 1e-5 (``same_kv``); a wrong or stale block differs by
whole units (the swapped-slot and stale-SSD cases below and in test_torch_tiers.py).
"""

import pytest

from replica.core.build import CoreSettings, EngineKnobs, build_core
from replica.core.sched.scheduler import SchedRequest
from shared.costmodel import CostModel
from shared.hashing import chain_ids

torch = pytest.importorskip("torch")

from replica.backends.torch_backend import TorchBackend, block_token_ids  # noqa: E402
from replica.backends.torchstack import TorchStack  # noqa: E402

BS = 4


def _requests() -> list[tuple[list[int], int]]:
    """Two system prompts, sessions growing turn by turn, and one-off prompts: reuse and
    evictions in a pool of 24 blocks (LRU). (hashes, input tokens with a partial tail)."""
    out = []
    for turn in range(4):
        for session in range(3):
            system = [1000 + session % 2] * 3
            ids = system + [session * 100 + t for t in range(2 * turn + 2)]
            out.append((chain_ids(ids), len(ids) * BS + 2))
        out.append((chain_ids([9000 + turn, 1, 2, 3, 4]), 5 * BS))
    return out


def _core(backend: bool, model: str = "tiny"):
    cost = CostModel.from_names(model, "h200")
    core = build_core(CoreSettings(capacity_blocks=24, block_size=BS, reuse="off", knobs=EngineKnobs(token_budget=6)), cost)
    tb = TorchBackend(cost.model, core.pool, "cpu", layers=2, seed=7).attach(core.scheduler) if backend else None
    return core, tb


def _serve_one(core, rid: int, hashes: list[int], tokens: int, now: float) -> float:
    """One request alone (submitted, stepped to completion): the order of pool events does
    not depend on step durations, so both backends see the same accesses."""
    core.scheduler.submit(SchedRequest(rid, hashes, tokens, 2, now))
    while core.scheduler.has_work():
        now += core.scheduler.step(now).duration
    return now + 1.0


RTOL = ATOL = 1e-5  # float32 rounding of differently shaped products (see the module docstring)


def same_kv(a: torch.Tensor | None, b: torch.Tensor) -> bool:
    """Equal K/V up to the rounding of the products' shapes."""
    return a is not None and torch.allclose(a, b, rtol=RTOL, atol=ATOL)


@pytest.fixture(autouse=True)
def one_thread():
    """Two cores shared with other work: one torch thread keeps these tests fast and steady."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _reference(stack: TorchStack, hashes: list[int]) -> list[torch.Tensor]:
    """Each block's K/V recomputed from scratch, block by block, in plain tensors."""
    s = stack.spec
    past_k: list[list[torch.Tensor]] = [[] for _ in stack.layers]
    past_v: list[list[torch.Tensor]] = [[] for _ in stack.layers]
    out = []
    for i, h in enumerate(hashes):
        block = torch.zeros((stack.n_layers, 2, BS, s.kv_heads, s.head_dim), dtype=stack.dtype)

        def keep(layer, k, v, block=block):
            block[layer, 0], block[layer, 1] = k, v

        past = [(torch.cat(past_k[j]), torch.cat(past_v[j])) for j in range(stack.n_layers)] if i else None
        x = stack.embed_tokens(torch.tensor(block_token_ids(h, BS, s.vocab)))
        with torch.inference_mode():
            stack.prefill(x, i * BS, past, keep)
        for j in range(stack.n_layers):
            past_k[j].append(block[j, 0])
            past_v[j].append(block[j, 1])
        out.append(block)
    return out


def replay_checked(core, tb: TorchBackend, check) -> tuple[dict[int, torch.Tensor], int]:
    """Serve the trace; after each request ``check(core, tb, expected)`` the blocks (returns how
    many it checked). ``expected``: each block recomputed once, from its whole chain."""
    ref = TorchStack(tb.spec, "cpu", 2, seed=7)
    expected: dict[int, torch.Tensor] = {}
    now, checked = 0.0, 0
    for rid, (hashes, tokens) in enumerate(_requests()):
        if hashes[-1] not in expected:
            expected.update(zip(hashes, _reference(ref, hashes)))
        now = _serve_one(core, rid, hashes, tokens, now)
        checked += check(core, tb, expected)
    return expected, checked


def _check_resident(core, tb: TorchBackend, expected: dict[int, torch.Tensor]) -> int:
    for h in core.pool.resident:
        assert same_kv(tb.block_kv(h), expected[h]), f"block {h:#x} differs from its recompute"
    return len(core.pool.resident)


@pytest.mark.parametrize("model", ["tiny", "tiny-moe"])
def test_blocks_served_from_cache_equal_a_recompute(model):
    core, tb = _core(True, model)
    expected, checked = replay_checked(core, tb, _check_resident)
    c = tb.counters
    assert c["blocks_read"] > 20 and c["blocks_computed"] > 24  # hits were read, and the pool evicted
    assert c["hits_not_in_slots"] == 0 and c["decode_steps"] > 0
    assert core.metrics.block_hits == c["blocks_read"]
    assert checked > 100
    # The check can fail: two slots swapped (a wrong slot / a stale block) are caught.
    a, b = list(core.pool.resident)[:2]
    tb.slot_of[a], tb.slot_of[b] = tb.slot_of[b], tb.slot_of[a]
    with pytest.raises(AssertionError, match="differs from its recompute"):
        _check_resident(core, tb, expected)


def test_hit_ratios_equal_the_emulated_backends():
    snaps = []
    for backend in (False, True):
        core, tb = _core(backend)
        now = 0.0
        for rid, (hashes, tokens) in enumerate(_requests()):
            now = _serve_one(core, rid, hashes, tokens, now)
        snap = core.metrics.snapshot()
        snaps.append({k: snap[k] for k in ("block_hits", "block_hit_ratio", "token_hit_ratio", "block_accesses")})
        if tb is not None:
            assert tb.counters["device_busy_s"] > 0
    assert snaps[0] == snaps[1]
    assert 0.3 < snaps[0]["block_hit_ratio"] < 0.9


@pytest.mark.slow
def test_a_live_replica_serves_from_the_paged_tensor_and_its_host_tier():
    from tests.conftest import free_port
    from tests.support.procs import Proc, http_json

    port = free_port()
    # 8 HBM blocks of 16 tokens; a host tier of 0.001 GiB (65 blocks of tiny's 16 KiB)
    replica = Proc(["-m", "kvemu", "replica", "--port", str(port), "--capacity-blocks", "8", "--time-scale", "0",
                    "--backend", "torch", "--device", "cpu", "--model", "tiny", "--layers", "2",
                    "--host-cache-gib", "0.001", "--fetch", "always"], port)
    try:
        replica.wait_healthy(timeout=90.0)  # importing torch on a busy 2-core machine takes a while
        body = {"token_ids": list(range(100)), "max_tokens": 3}
        status, first = http_json("POST", replica.url + "/generate", body)
        assert status == 200 and first["cached_tokens"] == 0
        status, again = http_json("POST", replica.url + "/generate", body)
        assert again["cached_tokens"] == 96  # 6 blocks read from the paged tensor
        other = {"token_ids": list(range(1000, 1100)), "max_tokens": 3}
        # Decode KV takes blocks too: 6 full blocks + 1 (the 4-token tail and 3 generated tokens)
        status, _ = http_json("POST", replica.url + "/generate", other)  # its 6 + 1 blocks evict 5 of the first's
        status, restored = http_json("POST", replica.url + "/generate", body)
        assert status == 200 and restored["cached_tokens"] == 96  # 5 blocks from the host tensor, 1 in HBM
        status, stats = http_json("GET", replica.url + "/stats")
        backend, moves = stats["backend"], stats["backend"]["tier_copies"]
        assert backend["name"] == "torch" and backend["blocks_computed"] == 12 and backend["blocks_read"] == 6 + 1
        assert backend["blocks_fetched"] == moves["host>hbm"] == stats["tiers"]["fetched_blocks"] == 5
        # down: the first request's 5 blocks, then 5 of the second's to make room for the restore (+ 1 tail)
        assert moves["hbm>host"] == stats["tiers"]["demoted_blocks"] == 10
        assert backend["decode_steps"] >= 4 and backend["device_busy_s"] > 0
    finally:
        assert replica.stop() == 0
