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
* **State groups** (linear attention, Mamba: vLLM's ``MambaManager`` in ``mamba_cache_mode`` "align", vLLM
  0.33's default whenever prefix caching is on). A block of a state group holds one state: the sequence's state
  after the block's last token. Only the latest state is ever read, so a request holds at most two blocks a
  group (``state_blocks``): the block of the state after its computed tokens and the one the step writes into
  (vLLM frees every token's block before the last computed one, ``get_num_skipped_tokens = computed - 1``: a
  window of two tokens, ``window_of``). A state becomes findable when a step ends exactly on its block's last
  token (``state_cached_block``), so prefill chunks are cut at block boundaries and stop at the last boundary
  before the request's last token and at a shared prefix's end (``state_chunk_tokens``, vLLM's
  ``Scheduler._mamba_block_aligned_split``). A hit (``state_hit``) is the last block, scanning back from the
  full groups' length, whose state every state group of the kind holds: one block, not a run
  (``MambaManager.find_longest_cache_hit``). A request whose hit ends on a state cached in the same step (by a
  request admitted before it) waits a step (``MambaManager.get_num_blocks_to_allocate``: its state is not
  computed yet), and admission stops behind it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import xxhash

from shared.kv_groups import FULL, STATE, WINDOW, KvGroup, KvGroups

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


def window_of(group: KvGroup) -> int:
    """The window a group frees its blocks by (``skipped_blocks``): a window group's; a state group's two tokens
    (vLLM's ``MambaManager`` skips every token before the last computed one); 0 for full attention."""
    return group.window if group.kind == WINDOW else 2 if group.kind == STATE else 0


def state_hit(held: Sequence[bool]) -> int:
    """Blocks of a state group's hit among ``held``: up to the last held block, whose state is the whole prefix's;
    none held, 0."""
    for i in range(len(held) - 1, -1, -1):
        if held[i]:
            return i + 1
    return 0


def state_blocks(computed_tokens: int, end_tokens: int, block_size: int) -> tuple[int, ...]:
    """The blocks a request holds in a state group while a step computes its tokens ``computed_tokens`` to
    ``end_tokens``: the block of the state after its computed tokens (at admission, the hit's last block) and,
    where it is a later one, the block the step writes the new state into."""
    held = [-(-computed_tokens // block_size) - 1] if computed_tokens > 0 else []
    last = -(-end_tokens // block_size) - 1
    if last >= 0 and (not held or last > held[-1]):
        held.append(last)
    return tuple(held)


def state_cached_block(end_tokens: int, block_size: int) -> int:
    """The block whose state a step ending at ``end_tokens`` makes findable: the one ending exactly there; -1 when
    the step ends inside a block (its state is overwritten in place until a step ends on the block's end)."""
    return end_tokens // block_size - 1 if end_tokens > 0 and end_tokens % block_size == 0 else -1


def state_chunk_tokens(start: int, tokens: int, prompt_tokens: int, all_tokens: int, block_size: int,
                       max_prefill: int, junction: int = 0) -> int:
    """Tokens of a prefill chunk a model with state groups schedules from ``start`` where ``tokens`` fit the
    budget (vLLM's ``_mamba_block_aligned_split``, no EAGLE, no prefill checkpoint): a chunk that does not reach
    the prefill's end ends on a block boundary (0 tokens where none is in reach and a block fits
    ``max_prefill``), and none runs past the next boundary when it starts inside a block, past the last
    boundary before the request's last token (``all_tokens``: prompt and output so far; the latest state a
    later hit can use), nor past ``junction`` (block-floored): where the full groups held a longer prefix than
    the state groups at admission (vLLM's ``shared_prefix_boundary``, Marconi's junction), so that a state is
    kept where requests share a prefix."""
    prefill_end = max(prompt_tokens, all_tokens - 1)
    if start >= prefill_end:
        return tokens
    end = start + tokens
    if end < prefill_end:
        aligned = end // block_size * block_size
        if aligned > start or block_size <= max_prefill:
            end = aligned
    stops = ((start // block_size + 1) * block_size if start % block_size else 0,
             (all_tokens - 1) // block_size * block_size,
             start + (junction - start) // block_size * block_size if start < junction < end else 0)
    end = min((s for s in stops if start < s < end), default=end)
    return max(end - start, 0)


def hit_blocks(groups: KvGroups, held: Callable[[int, int], bool], most: int, block_size: int) -> int:
    """The blocks of a prompt every group can serve, at most ``most``: ``held(group, i)`` says whether the
    group holds block ``i``. Full-attention groups first, then each window or state kind (a state of one size),
    until the length holds."""
    kinds: dict[tuple[str, int], list[int]] = {}
    for g, x in enumerate(groups.groups):
        kinds.setdefault((x.kind, x.window or x.state_bytes), []).append(g)
    length = most
    while True:
        before = length
        for (kind, window), ids in kinds.items():
            both = [all(held(g, i) for g in ids) for i in range(length)]
            if kind == FULL:
                length = both.index(False) if False in both else length
            elif kind == STATE:
                length = state_hit(both)
            else:
                length = window_hit(both, window, block_size)
        if length == before:
            return length
