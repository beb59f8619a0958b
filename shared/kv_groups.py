"""A model's layers in KV cache groups, as vLLM's hybrid KV cache manager forms them
(``vllm/v1/core/kv_cache_utils.py``, ``_get_kv_cache_groups_uniform_page_size``): layers of one attention kind
(full, or a sliding window of ``W`` tokens) form groups of ``group_size`` layers each, ``group_size`` the fewest
layers of any kind (or the most, padding the others, where the most are under 1.5 times the fewest); a kind of ``n`` layers
makes ``ceil(n / group_size)`` groups, its layers dealt round-robin. A block is one group's page of
``block_size`` tokens over ``group_size`` layers, every group's the same bytes, all drawn from one pool: capacity
in blocks is the KV budget over ``group_size`` layers' pages. A full-attention model is one group of all its
layers. What the cache does with groups (keys, freeing, hits) is the core's: replica/core/cache/groups.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FULL = "full"
WINDOW = "window"
KINDS = (FULL, WINDOW)


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
    size = most if most < fewest * 1.5 else fewest  # a little padding beats more groups (vLLM 0.33's rule)
    groups: list[KvGroup] = []
    for (kind, window), n in by_kind.items():
        count = -(-n // size)
        # vLLM deals layers round-robin (layers[i::count]): group i holds ceil((n - i) / count) of them
        groups.extend(KvGroup(kind, -(-(n - i) // count), window) for i in range(count))
    return KvGroups(tuple(groups), size)
