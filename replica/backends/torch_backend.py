"""``replica --backend torch``: the replica's KV blocks in a real paged tensor, computed by the
model's real layer stack (random weights), and step time read from the device.

* **Paged KV.** ``kv[slot, layer, k|v, token in block, kv head, head dim]`` holds one slot per
  pool block (the pool's capacity). A block's slot is found by its hash; a slot whose hash
  the pool no longer holds is reclaimed when a free one is needed.
* **Tokens.** Requests carry block hashes, not text; a block's token ids are derived from
  its chained hash (splitmix64 of hash and offset), so a block's K/V is a function of the
  whole token chain before it. The partial tail of a prompt (no hash) gets ids from the last
  block's hash; it is computed but not cached.
* **One forward per step**, as a chunked-prefill GPU step (vLLM v1): the step's prefill chunks
  and one token per decoder are packed into one batch and run through
  ``TorchStack.forward_packed`` once. A chunk computes the missed full blocks up to its end
  (holes included) and, once the prompt's end is reached, its partial tail; hits and blocks
  restored from a tier are read from their slots, not computed; a chunk that ends inside a
  block leaves that block to the next chunk. Each run of consecutive computed blocks is one
  sequence attending over the blocks before it, read from the paged tensor when the layer
  attends, after the layer's new K/V were written into their slots (as a paged-attention
  step writes the cache before attending): so a run after a hit reads the blocks before the
  hit that the same forward computes, and a request hitting blocks that another request
  computes in the same step reads them as written. Decoders attend in one padded call over
  their prompt blocks; generated tokens' K/V are not kept (as in the emulated backend: only
  prompt blocks are cache blocks).
* **Integrity.** A block's K/V agree with a from-scratch recompute to float rounding, not bit
  for bit: the rounding of a row of the packed products depends on how many rows the step
  packs (the GEMM kernel and its reduction order depend on the batch shape), and attention
  over a longer run of queries rounds differently per query (tests/replica/test_torch_backend.py
  compares with a float32 tolerance of 1e-5).
* **Tiers** (``--host-cache-gib`` / ``--ssd-cache-gib``): the tier stack decides what moves
  where, ``torch_tiers.TierMover`` copies the blocks (a host tensor, a memory-mapped SSD file);
  a block restored from a tier is read by the prefill, not computed.
* **Time** is the measured time of that one forward (device-synchronised; the paged reads and
  writes included, the host-side planning of the batch not), plus the tier copies since the
  last step, replacing the cost model's figure for the step. A fast-forwarded run of ``steps``
  decode steps (no prefill) is timed as ``steps`` x one step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from replica.backends.torch_tiers import TierMover
from replica.backends.torchstack import KV, DecodeGroup, Keep, PackedSeq, TorchStack, host_clock, synchronize
from replica.core.cache.pool import BlockPool
from replica.core.sched.scheduler import SchedRequest, Scheduler
from replica.core.tiers.stack import TierStack
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


@dataclass(slots=True)
class StepBatch:
    """A step's packed batch as planned on the host: token ids and positions of every row,
    the prefill sequences ``runs`` (first row, end row, start position, the slots of the blocks
    before it), and the computed full blocks (``keep_*``: their first rows, slots, hashes)."""

    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    runs: list[tuple[int, int, int, list[int]]] = field(default_factory=list)
    keep_rows: list[int] = field(default_factory=list)
    keep_slots: list[int] = field(default_factory=list)
    keep_hashes: list[int] = field(default_factory=list)
    computing: set[int] = field(default_factory=set)  # hashes this forward computes and writes

    def add(self, tokens: list[int], start: int) -> int:
        """Append rows for ``tokens`` at positions start...; returns the first row."""
        row = len(self.tokens)
        self.tokens.extend(tokens)
        self.positions.extend(range(start, start + len(tokens)))
        return row


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
                         "forwards": 0, "forward_tokens": 0, "device_busy_s": 0.0}
        # forwards: the steps' forwards run (one per step with work; ``stored``'s untimed one is not
        # counted); forward_tokens: the rows they packed; decode_steps: the decode steps timed (a
        # fast-forwarded run of n steps runs one forward and counts n)
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

    # ---- planning a step's packed batch (host side, not timed) -------------------------
    def _plan_prefill(self, batch: StepBatch, r: SchedRequest, end_token: int) -> None:
        """Add what request ``r`` computes to bring its K/V up to ``end_token``: the missed full
        blocks (hits and restored blocks are read), and once the prompt's end is reached its
        partial tail. Each run of consecutive computed blocks is one sequence."""
        hashes, bs, vocab = r.hashes, self.bs, self.spec.vocab
        done = self._progress.get(r.rid, 0)
        full = min(end_token // bs, len(hashes))
        hits = set(r.alloc.hit_idx) if r.alloc is not None else set()
        slots: list[int] = []
        runs: list[list[int]] = []
        for i in range(full):
            slot = self._read_slot(hashes[i], i < done or i in hits, i >= done)
            if slot is None:  # computed in this forward
                slot = self._slot_for(hashes[i])
                self.counters["blocks_computed"] += 1
                if runs and runs[-1][-1] == i - 1:
                    runs[-1].append(i)
                else:
                    runs.append([i])
            slots.append(slot)
        self._progress[r.rid] = full
        tail = 0
        if end_token >= r.input_tokens:
            self._progress.pop(r.rid, None)
            tail = r.input_tokens - len(hashes) * bs
        for run in runs:
            row0 = len(batch.tokens)
            for i in run:
                row = batch.add(block_token_ids(hashes[i], bs, vocab), i * bs)
                # A block another sequence of this forward also computes (a miss for both: the
                # scheduler charged both) is written once, by the first.
                if hashes[i] not in batch.computing:
                    batch.computing.add(hashes[i])
                    batch.keep_rows.append(row)
                    batch.keep_slots.append(slots[i])
                    batch.keep_hashes.append(hashes[i])
            if tail > 0 and run[-1] == len(hashes) - 1:  # the tail right after the run: the same sequence
                batch.add(block_token_ids(hashes[-1], tail, vocab), len(hashes) * bs)
                tail = 0
            batch.runs.append((row0, len(batch.tokens), run[0] * bs, slots[:run[0]]))
        if tail > 0:  # a tail after blocks read (or a prompt shorter than a block)
            row0 = batch.add(block_token_ids(hashes[-1] if hashes else r.rid, tail, vocab), len(hashes) * bs)
            batch.runs.append((row0, len(batch.tokens), len(hashes) * bs, slots))

    def _read_slot(self, block_hash: int, hit: bool, new: bool) -> int | None:
        """The slot to read a block from (``hit``: a cache hit, or a block of this prefill done in
        an earlier step; ``new``: first seen by this prefill), or None: compute it. A hit on a
        block another request computes in this forward is read as that forward writes it."""
        slot = self.slot_of.get(block_hash)
        if slot is None:
            if hit:  # should not happen: a hit whose K/V was never computed
                self.counters["hits_not_in_slots"] += 1
            return None
        if hit:
            if new:
                self.counters["blocks_read"] += 1
            return slot
        restored = self.mover.restored if self.mover is not None else set()
        if block_hash in restored:  # fetched from a tier: read, not computed
            restored.discard(block_hash)
            self.counters["blocks_fetched"] += 1
            return slot
        return None  # a miss: computed, even if its slot still holds it (the scheduler charged it)

    # ---- the forward (timed) ----------------------------------------------------------
    def _past_reader(self, slots: list[int]) -> Callable[[int], KV]:
        """Reads the K/V of the blocks in ``slots`` for a layer from the paged tensor, when the
        layer attends (after it wrote the blocks this forward computes)."""
        idx = torch.tensor(slots, device=self.device)
        shape = (len(slots) * self.bs, self.spec.kv_heads, self.spec.head_dim)

        def past(layer: int) -> KV:
            gathered = self.kv[idx, layer]  # [blocks, 2, block, kv heads, head dim]: the paged read
            return gathered[:, 0].reshape(shape), gathered[:, 1].reshape(shape)

        return past

    def _keeper(self, batch: StepBatch) -> Keep | None:
        """Writes each layer's new K/V of the computed full blocks into their slots."""
        if not batch.keep_slots:
            return None
        bs, s = self.bs, self.spec
        rows = torch.tensor([row + j for row in batch.keep_rows for j in range(bs)], device=self.device)
        slots = torch.tensor(batch.keep_slots, device=self.device)
        shape = (len(batch.keep_slots), bs, s.kv_heads, s.head_dim)

        def keep(layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
            self.kv[slots, layer, 0] = k[rows].view(shape)
            self.kv[slots, layer, 1] = v[rows].view(shape)

        return keep

    def _decode_group(self, decoders: list[SchedRequest], rows: slice) -> DecodeGroup:
        """The decoders' attention: one padded, masked call over each one's prompt blocks."""
        s, bs, n_layers = self.spec, self.bs, self.stack.n_layers
        blocks = [[self.slot_of[h] for h in r.hashes if h in self.slot_of] for r in decoders]
        width = max(len(b) for b in blocks)
        b, ctx = len(decoders), width * bs
        valid = torch.zeros((b, ctx + 1), dtype=torch.bool, device=self.device)
        for i, row in enumerate(blocks):
            valid[i, : len(row) * bs] = True
        valid[:, -1] = True  # the new token itself
        past = torch.empty((n_layers, 2, b, s.kv_heads, ctx + 1, s.head_dim), dtype=self.kv.dtype,
                           device=self.device)  # + one free position for the new token
        if width:
            idx = torch.tensor([row + [row[0] if row else 0] * (width - len(row)) for row in blocks], device=self.device)
            gathered = self.kv[idx]  # [b, width, layers, 2, bs, kvh, hd]: the paged read
            for i in range(n_layers):
                for j in (0, 1):
                    past[i, j, :, :, :ctx] = gathered[:, :, i, j].reshape(b, ctx, s.kv_heads, s.head_dim).transpose(1, 2)
        return DecodeGroup(rows, list(past[:, 0]), list(past[:, 1]), valid[:, None, None, :])

    def _forward(self, batch: StepBatch, decoders: list[SchedRequest]) -> None:
        """The step's one forward over every row of ``batch`` (the decoders' rows last)."""
        seqs: list[PackedSeq | DecodeGroup] = [
            PackedSeq(slice(a, b), start, self._past_reader(slots) if slots else None) for a, b, start, slots in batch.runs]
        if decoders:
            seqs.append(self._decode_group(decoders, slice(len(batch.tokens) - len(decoders), len(batch.tokens))))
        tokens = torch.tensor(batch.tokens, device=self.device)
        positions = torch.tensor(batch.positions, device=self.device)
        self.stack.forward_packed(self.stack.embed_tokens(tokens), positions, seqs, self._keeper(batch))

    # ---- the scheduler's hooks --------------------------------------------------------
    def step_time(self, chunks: list[tuple[SchedRequest, int, int]], decoders: list[SchedRequest], steps: int,
                  modelled: float) -> float:
        batch = StepBatch()
        # A request can have several chunks in a step (its segments around hits): its prefill goes
        # up to the last one's end.
        ends: dict[int, tuple[SchedRequest, int]] = {}
        for r, start, take in chunks:
            ends[id(r)] = (r, max(start + take, ends[id(r)][1] if id(r) in ends else 0))
        for r, end in ends.values():
            self._plan_prefill(batch, r, end)
        for r in decoders:
            batch.add(block_token_ids(r.rid, 1, self.spec.vocab), r.input_tokens + r.generated)
        forward_s = 0.0
        if batch.tokens:
            clock = time.perf_counter if self.device.type == "cuda" else host_clock()
            with torch.inference_mode():
                t0 = clock()
                self._forward(batch, decoders)
                synchronize(self.device)
                forward_s = clock() - t0
            self.counters["forwards"] += 1
            self.counters["forward_tokens"] += len(batch.tokens)
        if decoders:
            self.counters["decode_steps"] += steps
        if self.mover is not None:
            for h, slot in zip(batch.keep_hashes, batch.keep_slots):
                self.mover.computed(h, self.kv[slot])
        # steps > 1 only for a run of decode-only steps: each costs what the one run did
        busy = forward_s * (1 if chunks else steps) + (self.mover.take_pending() if self.mover is not None else 0.0)
        self.counters["device_busy_s"] += busy
        return busy

    def stored(self, r: SchedRequest, hashes: list[int]) -> None:
        """A finished request's response blocks were cached (``--response-kv keep``): compute
        their K/V after its prompt's, in one sequence as a recompute of the next turn would
        (its response blocks are one run of misses after its prompt's hits). Not timed: the
        decode steps that produced those tokens were. The prompt's K/V is read before any new
        block takes a slot, so a slot taken cannot be one a prompt block it reads was in."""
        slots = [self.slot_of.get(h) for h in r.hashes]
        if any(slot is None for slot in slots):  # cannot happen for a finished prompt; do not cache garbage
            self.pool.remove(hashes)
            self.counters["response_blocks_dropped"] += len(hashes)
            return
        if not r.response_hashes:
            return
        s, bs = self.spec, self.bs
        with torch.inference_mode():
            past = None
            if slots:  # copied out of the paged tensor now (see above)
                read = self._past_reader([slot for slot in slots if slot is not None])
                past = [read(i) for i in range(self.stack.n_layers)]
            tokens = [t for h in r.response_hashes for t in block_token_ids(h, bs, s.vocab)]
            out = torch.empty((self.stack.n_layers, 2, len(tokens), s.kv_heads, s.head_dim), dtype=self.kv.dtype,
                              device=self.device)

            def keep(layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
                out[layer, 0], out[layer, 1] = k, v

            x = self.stack.embed_tokens(torch.tensor(tokens, device=self.device))
            self.stack.prefill(x, len(r.hashes) * bs, past, keep)
            wanted = set(hashes)
            for j, h in enumerate(r.response_hashes):
                kv = out[:, :, j * bs:(j + 1) * bs]
                if h in wanted and h in self.pool.resident:
                    self.kv[self._slot_for(h)] = kv
                    self.counters["response_blocks_computed"] += 1
                if self.mover is not None:
                    self.mover.computed(h, kv)
