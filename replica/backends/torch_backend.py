"""``replica --backend torch``: the replica's KV blocks in a real paged tensor, computed by the
model's real layer stack (random weights), and step time read from the device.

* **Paged KV.** ``kv[slot, layer, k|v, token in block, kv head, head dim]`` holds one slot per
  pool block (the pool's capacity). A block's slot is found by its hash; a slot whose hash
  the pool no longer holds is reclaimed when a free one is needed.
* **Tokens.** Requests carry block hashes, not text; a block's token ids are derived from
  its chained hash (splitmix64 of hash and offset), so a block's K/V is a deterministic
  function of the whole token chain before it. The partial tail of a prompt (no hash) gets
  ids from the last block's hash; it is computed but not cached.
* **Prefill** runs block by block: each missed block attends over the K/V of the blocks
  before it, read from their slots (the hits' slots included: a hit is read, not recomputed).
  Computing a block as one unit is what makes its K/V independent of how the scheduler
  chunked the prompt, so a block served from cache equals the same block recomputed, bit
  for bit (tests/replica/test_torch_backend.py). A chunk that ends inside a block leaves
  that block to the next chunk.
* **Decode** runs one real step over the batch's prompt blocks (padded, masked); generated
  tokens' K/V are not kept (as in the emulated backend: only prompt blocks are cache
  blocks). A fast-forwarded run of ``steps`` decode steps is timed as ``steps`` x one step.
* **Tiers** (``--host-cache-gib`` / ``--ssd-cache-gib``): the tier stack decides what moves
  where, ``torch_tiers.TierMover`` copies the blocks (a host tensor, a memory-mapped SSD file);
  a block restored from a tier is read by the prefill, not computed.
* **Time** is the measured wall time of that work (device-synchronised), tier copies
  included, replacing the cost model's figure for the step.
"""

from __future__ import annotations

import time

import torch

from replica.backends.torch_tiers import TierMover
from replica.backends.torchstack import TorchStack, host_clock, synchronize
from replica.core.pool import BlockPool
from replica.core.scheduler import SchedRequest, Scheduler
from replica.core.tiers import TierStack
from shared.costmodel import ModelSpec
from shared.errors import KvemuError

MASK64 = (1 << 64) - 1


def block_token_ids(block_hash: int, count: int, vocab: int) -> list[int]:
    """``count`` token ids derived from a chained block hash (splitmix64, never built-in hash())."""
    out = []
    for j in range(count):
        z = (block_hash + (j + 1) * 0x9E3779B97F4A7C15) & MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        out.append((z ^ (z >> 31)) % vocab)
    return out


class SlotsExhaustedError(KvemuError):
    def __init__(self, capacity: int):
        super().__init__(f"torch backend: all {capacity} KV slots hold blocks the pool still keeps")


class TorchBackend:
    """Attach to a scheduler with ``attach``; it then times every step (``StepTimer``)."""

    def __init__(self, spec: ModelSpec, pool: BlockPool, device: str = "cpu", layers: int | None = None,
                 seed: int = 0, tiers: TierStack | None = None) -> None:
        self.spec, self.pool, self.bs = spec, pool, pool.block_size
        self.stack = TorchStack(spec, device, layers, seed)
        self.device = self.stack.device
        n_layers = self.stack.n_layers
        self.kv = torch.zeros((pool.capacity, n_layers, 2, self.bs, spec.kv_heads, spec.head_dim),
                              dtype=self.stack.dtype, device=self.device)
        self.slot_of: dict[int, int] = {}
        self.free = list(range(pool.capacity - 1, -1, -1))
        self._progress: dict[int, int] = {}  # rid -> blocks computed or read so far (prefill in flight)
        self.counters = {"blocks_computed": 0, "blocks_read": 0, "hits_not_in_slots": 0, "decode_steps": 0,
                         "blocks_fetched": 0, "response_blocks_computed": 0, "response_blocks_dropped": 0,
                         "device_busy_s": 0.0}
        self.mover = None if tiers is None else TierMover(tiers, self.device, tuple(self.kv.shape[1:]), self.kv.dtype,
                                                          self.block_kv, self._write_slot)

    def attach(self, scheduler: Scheduler) -> TorchBackend:
        scheduler.timer = self
        return self

    # ---- slots -----------------------------------------------------------------
    def _slot_for(self, block_hash: int) -> int:
        slot = self.slot_of.get(block_hash)
        if slot is not None:
            return slot
        if not self.free:
            resident = self.pool.resident
            stale = [h for h in self.slot_of if h not in resident]
            for h in stale:
                self.free.append(self.slot_of.pop(h))
            if not self.free:
                raise SlotsExhaustedError(self.pool.capacity)
        slot = self.free.pop()
        self.slot_of[block_hash] = slot
        return slot

    def _write_slot(self, block_hash: int, kv: torch.Tensor) -> None:
        self.kv[self._slot_for(block_hash)].copy_(kv)

    def block_kv(self, block_hash: int) -> torch.Tensor | None:
        """The cached K/V of a block ([layers, 2, block, kv heads, head dim]), or None."""
        slot = self.slot_of.get(block_hash)
        return None if slot is None else self.kv[slot]

    # ---- prefill -------------------------------------------------------------------
    def _past(self, slots: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        if not slots:
            return None
        gathered = self.kv[torch.tensor(slots, device=self.device)]  # the paged read
        s = self.spec
        return [(gathered[:, i, 0].reshape(-1, s.kv_heads, s.head_dim), gathered[:, i, 1].reshape(-1, s.kv_heads, s.head_dim))
                for i in range(self.stack.n_layers)]

    def _compute(self, hashes, index: int, count: int, ids_from: int, slots: list[int], keep_slot: int | None) -> None:
        """Run ``count`` tokens at block ``index`` over the blocks in ``slots``; keep K/V in ``keep_slot``."""
        kv = self._run(index, count, ids_from, self._past(slots))
        if keep_slot is not None:
            self.kv[keep_slot] = kv

    def _run(self, index: int, count: int, ids_from: int, past) -> torch.Tensor:
        """K/V [layers, 2, count, kv heads, head dim] of ``count`` tokens at block ``index`` over ``past``."""
        s = self.spec
        tokens = torch.tensor(block_token_ids(ids_from, count, s.vocab), device=self.device)
        out = torch.empty((self.stack.n_layers, 2, count, s.kv_heads, s.head_dim), dtype=self.kv.dtype, device=self.device)

        def keep(layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
            out[layer, 0], out[layer, 1] = k, v

        self.stack.prefill(self.stack.embed_tokens(tokens), index * self.bs, past, keep)
        return out

    def stored(self, r: SchedRequest, hashes: list[int]) -> None:
        """A finished request's response blocks were cached (``--response-kv keep``): compute
        their K/V block by block after its prompt's, as a recompute of the next turn would. Not
        timed: the decode steps that produced those tokens were. The past is kept in local
        tensors, so taking slots for the new blocks cannot reclaim a prompt block it reads."""
        slots = [self.slot_of.get(h) for h in r.hashes]
        if any(slot is None for slot in slots):  # cannot happen for a finished prompt; do not cache garbage
            self.pool.remove(hashes)
            self.counters["response_blocks_dropped"] += len(hashes)
            return
        past = self._past([slot for slot in slots if slot is not None])
        wanted = set(hashes)
        with torch.inference_mode():
            for j, h in enumerate(r.response_hashes):
                kv = self._run(len(r.hashes) + j, self.bs, h, past)
                past = [(torch.cat((k, kv[i, 0])), torch.cat((v, kv[i, 1]))) for i, (k, v) in enumerate(past or [])] \
                    if past else [(kv[i, 0], kv[i, 1]) for i in range(self.stack.n_layers)]
                if h in wanted and h in self.pool.resident:
                    self.kv[self._slot_for(h)] = kv
                    self.counters["response_blocks_computed"] += 1
                if self.mover is not None:
                    self.mover.computed(h, kv)

    def prefill_request(self, r: SchedRequest, end_token: int) -> None:
        """Bring request ``r``'s K/V up to ``end_token``: full blocks (hits read, misses computed)
        and, once the prompt's end is reached, its partial tail."""
        hashes, bs = r.hashes, self.bs
        done = self._progress.get(r.rid, 0)
        full = min(end_token // bs, len(hashes))
        hits = set(r.alloc.hit_idx) if r.alloc is not None else set()
        slots: list[int] = []
        restored = self.mover.restored if self.mover is not None else set()
        for i in range(full):
            slot = self.slot_of.get(hashes[i])
            if i >= done and i not in hits and hashes[i] in restored and slot is not None:
                restored.discard(hashes[i])  # fetched from a tier: read, not computed
                self.counters["blocks_fetched"] += 1
            elif i < done or i in hits:
                if slot is None:  # should not happen: a hit whose K/V was never computed
                    self.counters["hits_not_in_slots"] += 1
                    slot = self._fresh(hashes, i, slots)
                elif i >= done:
                    self.counters["blocks_read"] += 1
            else:
                slot = self._fresh(hashes, i, slots)
            slots.append(slot)
        self._progress[r.rid] = full
        tail = r.input_tokens - len(hashes) * bs
        if end_token >= r.input_tokens and tail > 0:
            self._compute(hashes, len(hashes), tail, hashes[-1] if hashes else r.rid, slots, None)
        if end_token >= r.input_tokens:
            self._progress.pop(r.rid, None)

    def _fresh(self, hashes, index: int, slots: list[int]) -> int:
        slot = self._slot_for(hashes[index])
        self._compute(hashes, index, self.bs, hashes[index], slots, slot)
        self.counters["blocks_computed"] += 1
        if self.mover is not None:
            self.mover.computed(hashes[index], self.kv[slot])
        return slot

    # ---- decode -------------------------------------------------------------------
    def decode(self, decoders: list[SchedRequest]) -> None:
        s = self.spec
        blocks = [[self.slot_of[h] for h in r.hashes if h in self.slot_of] for r in decoders]
        width = max((len(b) for b in blocks), default=0)
        if width == 0:
            return
        b = len(decoders)
        idx = torch.tensor([row + [row[0] if row else 0] * (width - len(row)) for row in blocks], device=self.device)
        valid = torch.zeros((b, width * self.bs + 1), dtype=torch.bool, device=self.device)
        for i, row in enumerate(blocks):
            valid[i, : len(row) * self.bs] = True
        valid[:, -1] = True  # the new token itself
        gathered = self.kv[idx]  # [b, width, layers, 2, bs, kvh, hd]: the paged read
        ctx = width * self.bs
        past = torch.empty((self.stack.n_layers, 2, b, s.kv_heads, ctx + 1, s.head_dim), dtype=self.kv.dtype,
                           device=self.device)  # + one free position for the new token
        for i in range(self.stack.n_layers):
            for j in (0, 1):
                past[i, j, :, :, :ctx] = gathered[:, :, i, j].reshape(b, ctx, s.kv_heads, s.head_dim).transpose(1, 2)
        past_k, past_v = list(past[:, 0]), list(past[:, 1])
        tokens = torch.tensor([block_token_ids(r.rid, 1, s.vocab)[0] for r in decoders], device=self.device)
        positions = torch.tensor([r.input_tokens + r.generated for r in decoders], device=self.device)
        self.stack.decode(self.stack.embed_tokens(tokens), positions, past_k, past_v, valid[:, None, None, :])
        self.counters["decode_steps"] += 1

    # ---- the scheduler's hook -----------------------------------------------------------
    def step_time(self, chunks: list[tuple[SchedRequest, int, int]], decoders: list[SchedRequest], steps: int,
                  modelled: float) -> float:
        clock = time.perf_counter if self.device.type == "cuda" else host_clock()
        t0 = clock()
        with torch.inference_mode():
            for r, start, take in chunks:
                self.prefill_request(r, start + take)
            synchronize(self.device)
            prefill_s = clock() - t0
            decode_s = 0.0
            if decoders:
                t1 = clock()
                self.decode(decoders)
                synchronize(self.device)
                decode_s = clock() - t1
        busy = prefill_s + steps * decode_s + (self.mover.take_pending() if self.mover is not None else 0.0)
        self.counters["device_busy_s"] += busy
        return busy
