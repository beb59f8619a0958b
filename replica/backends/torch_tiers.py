"""Real copies for the memory tiers under ``replica --backend torch``.

The tier stack (replica/core/tiers/stack.py) decides what moves where; ``TierMover`` executes each
move on real K/V the moment the stack decides it, so the data follows the decisions in the
same order:

* **host** (and any level kept in memory): a host tensor of blocks (pinned when the device is
  CUDA), one slot per block of the level; **SSD** (and any level whose kind is ``in_file``,
  replica/core/tiers/levels.py): a memory-mapped file of slots (``ssd-kv.bin``, ``<name>-kv.bin``,
  in a private temporary directory, removed on ``close``). A slot is found by the block's hash; a slot whose block
  the tier no longer holds is reclaimed when a free one is needed (as the device slots are).
* **Moves**: HBM -> host / SSD (demotions, inclusive copies), host -> SSD (spills), host /
  SSD -> HBM (restores into the slot of the block the allocation gave). A restored block is
  read by the prefill instead of computed.
* **Owed copies**: a block can be moved before its K/V exists (inclusive mode copies a
  block when its request is admitted; a preempted request's uncomputed blocks can be
  demoted). The move is then owed and made when the block is computed; a restore of a block
  whose copy is still owed brings nothing and the prefill computes the block.
* **Time**: each move is timed on the device (synchronised) and added to the next step.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Collection, Sequence

import torch

from replica.backends.torchstack import host_clock, synchronize
from replica.core.tiers.levels import level_kind
from replica.core.tiers.stack import Level, TierStack
from shared.errors import KvemuError


class TierSlotsExhaustedError(KvemuError):
    def __init__(self, name: str, capacity: int):
        super().__init__(f"torch backend: all {capacity} {name} slots hold blocks the {name} tier still keeps")


class BlockSlots:
    """``capacity`` block slots in ``data`` ([capacity, *block shape]), found by hash."""

    def __init__(self, name: str, data: torch.Tensor, resident: Callable[[], Collection[int]]) -> None:
        self.name, self.data, self.resident = name, data, resident
        self.slot_of: dict[int, int] = {}
        self.free = list(range(data.shape[0] - 1, -1, -1))

    def get(self, block_hash: int) -> torch.Tensor | None:
        slot = self.slot_of.get(block_hash)
        return None if slot is None else self.data[slot]

    def put(self, block_hash: int, kv: torch.Tensor) -> None:
        slot = self.slot_of.get(block_hash)
        if slot is None:
            if not self.free:
                held = self.resident()
                for h in [h for h in self.slot_of if h not in held]:
                    self.free.append(self.slot_of.pop(h))
                if not self.free:
                    raise TierSlotsExhaustedError(self.name, self.data.shape[0])
            slot = self.free.pop()
            self.slot_of[block_hash] = slot
        self.data[slot].copy_(kv)


def memory_slots(level: Level, shape: tuple[int, ...], dtype: torch.dtype, pinned: bool) -> BlockSlots:
    """A level's slots in a host tensor (pinned for CUDA copies)."""
    pool = level.pool
    data = torch.empty((pool.capacity, *shape), dtype=dtype, pin_memory=pinned)
    return BlockSlots(level.name, data, lambda: pool.resident)


def file_slots(level: Level, shape: tuple[int, ...], dtype: torch.dtype, directory: str) -> BlockSlots:
    """A level's slots in a memory-mapped file, ``<name>-kv.bin`` in ``directory``."""
    pool = level.pool
    numel = pool.capacity
    for n in shape:
        numel *= n
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    raw = torch.from_file(os.path.join(directory, f"{level.name}-kv.bin"), shared=True, size=nbytes,
                          dtype=torch.uint8)
    return BlockSlots(level.name, raw.view(dtype).view(pool.capacity, *shape), lambda: pool.resident)


class TierMover:
    """The ``TierCopies`` of a torch backend: ``device`` reads and writes the backend's HBM slots."""

    def __init__(self, tiers: TierStack, device: torch.device, shape: tuple[int, ...], dtype: torch.dtype,
                 read_hbm: Callable[[int], torch.Tensor | None], write_hbm: Callable[[int, torch.Tensor], None]) -> None:
        self.tiers, self.device = tiers, device
        self.read_hbm, self.write_hbm = read_hbm, write_hbm
        in_file = [lv for lv in tiers.levels if level_kind(lv.name).in_file]
        self._dir = tempfile.TemporaryDirectory(prefix="kvemu-ssd-") if in_file else None
        self.stores: dict[str, BlockSlots] = {}
        for lv in tiers.levels:
            if self._dir is not None and lv in in_file:
                self.stores[lv.name] = file_slots(lv, shape, dtype, self._dir.name)
            else:
                self.stores[lv.name] = memory_slots(lv, shape, dtype, device.type == "cuda")
        self.owed: dict[int, str] = {}  # block -> the tier its copy is owed to (its K/V did not exist yet)
        self.restored: set[int] = set()  # blocks restored into HBM, not yet read by their prefill
        self.pending_s = 0.0  # move time not yet charged to a step
        # every move a level may make: down the hierarchy, then each level's restore into HBM
        names = ["hbm", *tiers.names]
        self.counters: dict[str, float] = {f"{a}>{b}": 0 for i, a in enumerate(names) for b in names[i + 1:]}
        self.counters.update({f"{name}>hbm": 0 for name in tiers.names})
        self.counters.update({"owed": 0, "restored_without_kv": 0, "copy_s": 0.0})
        tiers.copies = self

    def copy(self, src: str, dst: str, hashes: Sequence[int]) -> None:
        clock = host_clock()
        t0 = clock()
        for h in hashes:
            kv = self.read_hbm(h) if src == "hbm" else self.stores[src].get(h)
            if kv is None:  # not computed yet: copied down when it is; restored: the prefill computes it
                if dst == "hbm":
                    self.counters["restored_without_kv"] += 1
                else:
                    self.owed[h] = dst
                    self.counters["owed"] += 1
                continue
            self.counters[f"{src}>{dst}"] += 1
            if dst == "hbm":
                self.write_hbm(h, kv)
                self.restored.add(h)
            else:
                self.stores[dst].put(h, kv)
        synchronize(self.device)
        spent = clock() - t0
        self.pending_s += spent
        self.counters["copy_s"] += spent

    def computed(self, block_hash: int, kv: torch.Tensor) -> None:
        """A block's K/V now exists in HBM: make the copy owed to a tier that still holds it."""
        self.restored.discard(block_hash)
        dst = self.owed.pop(block_hash, None)
        if dst is None:
            return
        tier = self.tiers.pool(dst)
        if tier is not None and block_hash in tier.resident:
            clock = host_clock()
            t0 = clock()
            self.stores[dst].put(block_hash, kv)
            synchronize(self.device)
            self.pending_s += clock() - t0
            self.counters[f"hbm>{dst}"] += 1

    def take_pending(self) -> float:
        spent, self.pending_s = self.pending_s, 0.0
        return spent

    def block_kv(self, tier: str, block_hash: int) -> torch.Tensor | None:
        """A block's K/V in the level of that name (None: not there)."""
        store = self.stores.get(tier)
        return None if store is None else store.get(block_hash)

    def close(self) -> None:
        for name in [name for name in self.stores if level_kind(name).in_file]:
            del self.stores[name]  # its file's mapping goes before the directory
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
