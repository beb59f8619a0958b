"""A state group's blocks of one request in a ``GroupedPool`` (cache/grouped.py), as vLLM 0.33's ``MambaManager``
holds them in 'align' mode (``vllm/v1/core/single_type_kv_cache_manager.py``); the rules are groups.py's.

A request holds at most two blocks of a state group: the one of the state after its computed tokens and the one a
step writes into. Its table (``GroupedAllocation.tables[g]``) holds the hashed ones among its prompt's blocks,
``at[g]`` their block indices; a block the step ends inside of is a private block (``private[g]``: its index
among the prompt's blocks; past them it is one of the request's private blocks the scheduler counts, freed as the
window logic frees them). A hashed state block becomes findable only where a step ends exactly on its last token,
and is remembered as cached in this step (``StateTables.cached_now``): a later admission whose hit ends on it
waits a step (vLLM's ``cached_blocks_this_step``).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class StateHeld:
    """One request's state blocks per state group: the indices of its table's hashed keys (``at``, parallel to
    ``tables[g]``) and of the private blocks it holds among its prompt's blocks (``private``)."""

    at: dict[int, list[int]] = field(default_factory=dict)
    private: dict[int, list[int]] = field(default_factory=dict)
    junction: int = 0  # tokens the full groups held beyond the hit at admission (vLLM's shared_prefix_boundary)


@dataclass(slots=True)
class StateTables:
    """What the pool keeps for its state groups across requests: their ids, and the state keys cached in the
    step now being scheduled (a hit ending on one is not computed yet)."""

    ids: tuple[int, ...]
    cached_now: set[int] = field(default_factory=set)

    def new_step(self) -> None:
        self.cached_now.clear()


def state_new_block(end_tokens: int, blocks: int, held_end: int, block_size: int) -> int:
    """The block a state group takes for a chunk ending at ``end_tokens`` (of ``blocks`` blocks): the chunk's last
    block when it is past those held (``held_end``: the end of the blocks taken), else -1."""
    last = min(-(-end_tokens // block_size), blocks) - 1
    return last if last >= held_end else -1


def state_held(held: StateHeld, g: int, tables_g: list[int], blocks: int, freed: int, n: int) -> int:
    """Blocks a request holds in state group ``g``: its hashed and private prompt blocks, and those past its
    prompt's (of ``blocks``) not freed yet."""
    return len(tables_g) + len(held.private.get(g, ())) + max(0, blocks - max(freed, n))
