"""KV cache groups: a model whose layers attend differently (full attention, a sliding window) keeps one group
of blocks per kind, as vLLM's hybrid KV cache manager does (``vllm/v1/core/kv_cache_coordinator.py``,
``single_type_kv_cache_manager.py``, ``kv_cache_utils.py``). The one definition of its rules in kvemu:

* **Groups** (``group_layers``, vLLM's ``_get_kv_cache_groups_uniform_page_size``): layers of one kind form
  groups of ``group_size`` layers each, ``group_size`` the fewest layers of any kind (or the most, padding the
  others, where that wastes under a quarter); a kind of ``n`` layers makes ``ceil(n / group_size)`` groups. A
  block is one group's page of ``block_size`` tokens over ``group_size`` layers, every group's the same bytes,
  all drawn from one pool: capacity in blocks is the KV budget over ``group_size`` layers' pages
  (``KvGroups.block_bytes``). A full-attention model is one group of all its layers: what kvemu always had.
* **Keys**: a block's hash names it in every group; the pool keys group ``g``'s copy by ``group_key(h, g)``
  (vLLM's ``BlockHashWithGroupId``), group 0's by the hash itself, so a one-group model's keys are unchanged.
* **Freeing** (``skipped_blocks``, vLLM's ``SlidingWindowManager.remove_skipped_blocks``): once a request has
  computed ``t`` tokens, a window of ``W`` tokens never reads tokens before ``t - W + 1`` again, so its
  ``(t - W + 1) // block_size`` leading blocks go back to the pool (cached still, evictable).
* **Hits** (``hit_blocks``, vLLM's ``HybridKVCacheCoordinator.find_longest_cache_hit``): the full-attention
  groups' leading run of blocks every one of them holds, then each window kind's rule below that length
  (``window_hit``: scanning back from it, the first run of ``ceil((W - 1) / block_size)`` blocks every group
  of the kind holds ends the hit; none, the run from block 0), again until no kind shortens it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import xxhash

FULL = "full"
WINDOW = "window"
KINDS = (FULL, WINDOW)
_PACK = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class KvGroup:
    """One group: its attention kind, the window (tokens, ``WINDOW`` only) and the model's layers it holds
    (fewer than ``KvGroups.group_size`` where vLLM pads it)."""

    kind: str
    layers: int
    window: int = 0


@dataclass(frozen=True, slots=True)
class KvGroups:
    """A model's groups, in vLLM's order (kinds as their layers first appear, a kind's groups together)."""

    groups: tuple[KvGroup, ...]
    group_size: int

    @property
    def hybrid(self) -> bool:
        return len(self.groups) > 1

    def block_bytes(self, layer_page_bytes: int) -> int:
        """A block's bytes: ``group_size`` layers' pages (``layer_page_bytes``: one layer's block of tokens)."""
        return self.group_size * layer_page_bytes

    def describe(self) -> list[dict]:
        """Per group, what ``/stats`` and the sim JSON show."""
        return [{"group": g, "kind": x.kind, "layers": x.layers, **({"window": x.window} if x.kind == WINDOW else {})}
                for g, x in enumerate(self.groups)]


def full_attention(layers: int) -> KvGroups:
    """Every layer full attention: one group of them all."""
    return KvGroups((KvGroup(FULL, layers),), layers)


def group_layers(kinds: Sequence[tuple[str, int]]) -> KvGroups:
    """vLLM's groups of layers of one page size, from each layer's ``(kind, window)`` in layer order."""
    by_kind: dict[tuple[str, int], int] = {}
    for kind, window in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown attention kind {kind!r}")
        key = (kind, window if kind == WINDOW else 0)
        by_kind[key] = by_kind.get(key, 0) + 1
    if not by_kind:
        raise ValueError("a model has at least one layer")
    fewest, most = min(by_kind.values()), max(by_kind.values())
    size = most if most < fewest * 1.25 else fewest  # a little padding beats more groups (vLLM's rule)
    groups: list[KvGroup] = []
    for (kind, window), n in by_kind.items():
        count = -(-n // size)
        # vLLM deals layers round-robin (layers[i::count]): group i holds ceil((n - i) / count) of them
        groups.extend(KvGroup(kind, -(-(n - i) // count), window) for i in range(count))
    return KvGroups(tuple(groups), size)


def group_key(h: int, group: int) -> int:
    """The pool's key of block ``h`` in ``group``: the hash itself in group 0, else a 64-bit hash of both."""
    if group == 0:
        return h
    return xxhash.xxh3_64_intdigest((h & _PACK).to_bytes(8, "little") + group.to_bytes(4, "little"))


def skipped_blocks(window: int, computed_tokens: int, block_size: int) -> int:
    """Leading blocks a window of ``window`` tokens no longer reads once ``computed_tokens`` are computed."""
    return max(0, computed_tokens - window + 1) // block_size


def window_hit(held: Sequence[bool], window: int, block_size: int) -> int:
    """Blocks of a window group's hit among ``held`` (whether each leading block is held, up to the most a
    hit may take): the end of the last run of ``ceil((window - 1) / block_size)`` held blocks, scanning
    back; none such, the run from block 0."""
    need = -(-(window - 1) // block_size)
    run = 0
    for i in range(len(held) - 1, -1, -1):
        if held[i]:
            run += 1
            if run >= need:
                return i + run
        else:
            run = 0
    return run


def hit_blocks(groups: KvGroups, held: Callable[[int, int], bool], most: int, block_size: int) -> int:
    """The blocks of a prompt every group can serve, at most ``most``: ``held(group, i)`` says whether the
    group holds block ``i``. Full-attention groups first, then each window kind, until the length holds."""
    kinds: dict[tuple[str, int], list[int]] = {}
    for g, x in enumerate(groups.groups):
        kinds.setdefault((x.kind, x.window), []).append(g)
    length = most
    while True:
        before = length
        for (kind, window), ids in kinds.items():
            both = [all(held(g, i) for g in ids) for i in range(length)]
            if kind == FULL:
                length = both.index(False) if False in both else length
            else:
                length = window_hit(both, window, block_size)
        if length == before:
            return length
