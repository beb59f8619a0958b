"""A model's layers in KV cache groups, as vLLM's hybrid KV cache manager forms them
(``vllm/v1/core/kv_cache_utils.py``, ``_get_kv_cache_groups_uniform_page_size``): layers of one attention kind
(full, or a sliding window of ``W`` tokens) form groups of ``group_size`` layers each, ``group_size`` the fewest
layers of any kind (or the most, padding the others, where the most are under 1.5 times the fewest); a kind of ``n`` layers
makes ``ceil(n / group_size)`` groups, its layers dealt round-robin. A block is one group's page of
``block_size`` tokens over ``group_size`` layers, every group's the same bytes, all drawn from one pool: capacity
in blocks is the KV budget over ``group_size`` layers' pages. A full-attention model is one group of all its
layers. What the cache does with groups (keys, freeing, hits) is the core's: replica/core/cache/groups.py.

**State layers** (``STATE``: Qwen3-Next's Gated DeltaNet linear attention, Mamba layers; vLLM's ``MambaSpec``) keep
a fixed-size state per sequence, not KV per token: their page is one state (a conv state and a recurrent state),
``state_bytes``. vLLM makes every page one size by raising the attention block size until one layer's attention
page holds a state (``Platform._align_hybrid_block_size``: the fewest tokens, a multiple of the attention kernel's
block of 16, whose page on one rank is at least a state's bytes on that rank; ``state_block_size``), then pads the
state page to the attention page; the groups are then formed as above, a state kind like any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FULL = "full"
WINDOW = "window"
STATE = "state"
KINDS = (FULL, WINDOW, STATE)
# The attention kernel's block: FlashAttention takes multiples of 16 tokens (vLLM's FlashAttentionBackend
# ``get_supported_kernel_block_sizes``), the alignment of the block size vLLM raises for state layers
KERNEL_BLOCK_TOKENS = 16


@dataclass(frozen=True, slots=True)
class KvGroup:
    """One group: its attention kind, the window (tokens, ``WINDOW`` only), the state (bytes of one sequence's
    state in one layer over every tensor-parallel rank, ``STATE`` only) and the model's layers it holds (fewer
    than ``KvGroups.group_size`` where vLLM pads it)."""

    kind: str
    layers: int
    window: int = 0
    state_bytes: int = 0


@dataclass(frozen=True, slots=True)
class KvGroups:
    """A model's groups, in vLLM's order (kinds as their layers first appear, a kind's groups together)."""

    groups: tuple[KvGroup, ...]
    group_size: int

    @property
    def hybrid(self) -> bool:
        return len(self.groups) > 1

    @property
    def state_bytes(self) -> int:
        """The largest state a state group's layer keeps (0: no state layers), what vLLM sizes the page by."""
        return max((g.state_bytes for g in self.groups if g.kind == STATE), default=0)

    def block_bytes(self, layer_page_bytes: int) -> int:
        """A block's bytes: ``group_size`` layers' pages (``layer_page_bytes``: one layer's block of tokens)."""
        return self.group_size * layer_page_bytes

    def describe(self) -> list[dict]:
        """Per group, what ``/stats`` and the sim JSON show."""
        return [{"group": g, "kind": x.kind, "layers": x.layers, **({"window": x.window} if x.kind == WINDOW else {}),
                 **({"state_bytes": x.state_bytes} if x.kind == STATE else {})}
                for g, x in enumerate(self.groups)]


def full_attention(layers: int) -> KvGroups:
    """Every layer full attention: one group of them all."""
    return KvGroups((KvGroup(FULL, layers),), layers)


def group_layers(kinds: Sequence[tuple[str, int]]) -> KvGroups:
    """vLLM's groups of layers of one page size, from each layer's ``(kind, size)`` in layer order: the size is
    a window's tokens, a state's bytes (``KvGroup.state_bytes``), 0 for full attention."""
    by_kind: dict[tuple[str, int], int] = {}
    for kind, size in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown attention kind {kind!r}")
        key = (kind, 0 if kind == FULL else size)
        by_kind[key] = by_kind.get(key, 0) + 1
    if not by_kind:
        raise ValueError("a model has at least one layer")
    if all(kind == STATE for kind, _ in by_kind):
        raise ValueError("a model of state layers only has no attention page to size its blocks by")
    fewest, most = min(by_kind.values()), max(by_kind.values())
    size = most if most < fewest * 1.5 else fewest  # a little padding beats more groups (vLLM 0.33's rule)
    groups: list[KvGroup] = []
    for (kind, extent), n in by_kind.items():
        count = -(-n // size)
        window, state = (extent, 0) if kind == WINDOW else (0, extent)
        # vLLM deals layers round-robin (layers[i::count]): group i holds ceil((n - i) / count) of them
        groups.extend(KvGroup(kind, -(-(n - i) // count), window, state) for i in range(count))
    return KvGroups(tuple(groups), size)


def state_block_size(block_size: int, state_rank_bytes: int, token_rank_bytes: int,
                     kernel_block: int = KERNEL_BLOCK_TOKENS) -> int:
    """The block size vLLM serves a model with state layers at (``Platform._align_hybrid_block_size``): the
    fewest tokens, a multiple of the configured ``block_size`` (at least the kernel's block), whose one-layer
    attention page on one rank (``token_rank_bytes`` a token) holds one state on that rank
    (``state_rank_bytes``), rounded up to the kernel's block. The state's page is then padded to that page."""
    if state_rank_bytes <= 0:
        return block_size
    align = max(kernel_block, block_size)
    need = align * -(-state_rank_bytes // (align * token_rank_bytes))
    return max(block_size, kernel_block * -(-need // kernel_block))
