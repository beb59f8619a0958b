"""The one place hit ratios and the compute-savings ratio (CSR) are computed from counts.

CSR (from When Fancy Eviction Fails, see docs/sources.md) = recompute cost of the reused blocks / recompute cost of
every block looked up, where a block's cost grows with its depth; with a constant cost it
equals the block hit ratio. Counts from several replicas add up before dividing.
"""

from __future__ import annotations

from dataclasses import dataclass


def ratio(part: float, whole: float) -> float:
    """``part / whole``, 0 for nothing looked up yet."""
    return part / whole if whole else 0.0


@dataclass(slots=True)
class CacheCounts:
    block_accesses: int = 0
    block_hits: int = 0
    tokens_queried: int = 0
    tokens_hit: int = 0
    cost_total: float = 0.0
    cost_hit: float = 0.0

    def __add__(self, other: CacheCounts) -> CacheCounts:
        return CacheCounts(self.block_accesses + other.block_accesses, self.block_hits + other.block_hits,
                           self.tokens_queried + other.tokens_queried, self.tokens_hit + other.tokens_hit,
                           self.cost_total + other.cost_total, self.cost_hit + other.cost_hit)

    @property
    def block_hit_ratio(self) -> float:
        return ratio(self.block_hits, self.block_accesses)

    @property
    def token_hit_ratio(self) -> float:
        return ratio(self.tokens_hit, self.tokens_queried)

    @property
    def csr(self) -> float:
        return ratio(self.cost_hit, self.cost_total)

    def ratios(self) -> dict[str, float]:
        return {"block_hit_ratio": self.block_hit_ratio, "token_hit_ratio": self.token_hit_ratio, "csr": self.csr}
