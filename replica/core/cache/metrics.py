"""Per-replica cache metrics: hit ratios, compute-savings ratio (CSR), holes, one-hit blocks.

The ratios themselves (hit ratios, CSR) are computed in ``shared.ratios`` only.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from replica.core.cache.costs import DepthCosts
from replica.core.cache.types import Allocation
from shared.ratios import CacheCounts, ratio


def log2_bucket_label(k: int) -> str:
    """Label of bucket ``k = x.bit_length()``: 0 holds 0, k >= 1 holds [2^(k-1), 2^k)."""
    if k == 0:
        return "0"
    lo, hi = 1 << (k - 1), (1 << k) - 1
    return str(lo) if lo == hi else f"{lo}-{hi}"


def quantile_from_counts(counts: dict[int, int], q: float) -> float:
    total = sum(counts.values())
    if total == 0:
        return 0.0
    rank = q * (total - 1)
    seen = 0
    for value in sorted(counts):
        seen += counts[value]
        if seen > rank:
            return float(value)
    return float(max(counts))


class PoolMetrics:
    def __init__(
        self,
        block_size: int = 16,
        block_cost: Callable[[int], float] | DepthCosts | None = None,
        bytes_per_block: int = 0,
        reuse_tracker: Any | None = None,
    ) -> None:
        self.block_size = block_size
        self.bytes_per_block = bytes_per_block
        if isinstance(block_cost, DepthCosts):
            self.costs = block_cost
        else:
            self.costs = DepthCosts(block_cost) if block_cost is not None else DepthCosts()
        self.reuse = reuse_tracker
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.block_accesses = 0
        self.block_hits = 0
        self.prefix_hit_blocks = 0
        self.tokens_queried = 0
        self.tokens_hit = 0
        self.cost_total = 0.0
        self.cost_hit = 0.0
        self.inserted = 0
        self.evictions = 0
        self.one_hit_evictions = 0
        self.holes_total = 0
        self.holes_per_request: Counter[int] = Counter()
        self.hole_length_log2: Counter[int] = Counter()
        self.hole_blocks = 0

    def block_cost(self, index: int) -> float:
        """Recompute cost of the block at depth ``index``."""
        return self.costs(index)

    # ---- recording --------------------------------------------------------------
    def record_request(self, alloc: Allocation, n: int, input_tokens: int | None, now: float) -> None:
        costs = self.costs
        costs.grow(n)
        hits = len(alloc.hit_idx)
        self.requests += 1
        self.block_accesses += n
        self.block_hits += hits
        self.prefix_hit_blocks += alloc.prefix_blocks if hits else 0
        queried = input_tokens if input_tokens is not None else n * self.block_size
        self.tokens_queried += queried
        self.tokens_hit += min(hits * self.block_size, queried)
        self.cost_total += costs.total(n)
        if hits:
            self.cost_hit += costs.of_depths(alloc.hit_idx)
        self.holes_per_request[alloc.holes] += 1
        if alloc.holes:
            self.holes_total += alloc.holes
            for length in alloc.hole_lengths:
                self.hole_length_log2[length.bit_length()] += 1
                self.hole_blocks += length
        if self.reuse is not None:
            self.reuse.defer(alloc.hashes, now)

    def load_counts(self, counts: dict) -> None:
        """Become the counters the compiled pool reached (``replica.core.compiled.pool``) from these
        metrics fresh: every field ``record_request`` and the pool keep (the reuse tracker is fed
        directly)."""
        for name, value in counts.items():
            setattr(self, name, Counter(value) if isinstance(value, dict) else value)

    # ---- reporting --------------------------------------------------------------
    def counts(self) -> CacheCounts:
        return CacheCounts(self.block_accesses, self.block_hits, self.tokens_queried, self.tokens_hit,
                           self.cost_total, self.cost_hit)

    def snapshot(self, resident_blocks: int = 0, resident_not_reused: int = 0) -> dict:
        acc = self.block_accesses
        counts = self.counts()
        one_hit = self.one_hit_evictions + resident_not_reused
        hist = self.holes_per_request
        out = {
            "requests": self.requests,
            "block_accesses": acc,
            "block_hits": self.block_hits,
            "block_hit_ratio": counts.block_hit_ratio,
            "prefix_block_hit_ratio": ratio(self.prefix_hit_blocks, acc),
            "tokens_queried": self.tokens_queried,
            "tokens_hit": self.tokens_hit,
            "token_hit_ratio": counts.token_hit_ratio,
            "csr": counts.csr,
            "recompute_cost_total_s": self.cost_total,
            "recompute_cost_saved_s": self.cost_hit,
            "inserted_blocks": self.inserted,
            "evictions": self.evictions,
            "one_hit_blocks": one_hit,
            "one_hit_bytes": one_hit * self.bytes_per_block,
            "resident_blocks": resident_blocks,
            "holes": {
                "total": self.holes_total,
                "mean_per_request": ratio(self.holes_total, self.requests),
                "p99_per_request": quantile_from_counts(hist, 0.99),
                "max_per_request": max(hist) if hist else 0,
                "recomputed_blocks": self.hole_blocks,
                "length_log2_hist": {log2_bucket_label(k): v for k, v in sorted(self.hole_length_log2.items())},
            },
        }
        if self.reuse is not None:
            out["reuse"] = self.reuse.to_dict()
        return out
