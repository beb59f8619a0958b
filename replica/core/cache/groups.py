"""KV cache groups: a model whose layers attend differently (full attention, a sliding window) keeps one group
of blocks per kind, as vLLM's hybrid KV cache manager does (``vllm/v1/core/kv_cache_coordinator.py``,
``single_type_kv_cache_manager.py``, ``kv_cache_utils.py``). The one definition of its rules in kvemu:

* **Groups**: a model's layers in groups of one page size (shared/kv_groups.py, vLLM's rule): a block is one
  group's page; a full-attention model is one group of all its layers, what kvemu always had.
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

import xxhash

from shared.kv_groups import FULL, KvGroups

_PACK = (1 << 64) - 1


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
