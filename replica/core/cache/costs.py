"""Recompute cost per block depth: one table that the metrics (CSR) and cost-aware policies share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate


def unit_cost(depth: int) -> float:
    """Every block costs the same: CSR then equals the block hit ratio."""
    return 1.0


class DepthCosts:
    """``cost(depth)`` and prefix sums, grown on demand from a function of depth (cached)."""

    __slots__ = ("_cum", "_fn", "costs")

    def __init__(self, fn: Callable[[int], float] = unit_cost) -> None:
        self._fn = fn
        self.costs: list[float] = []
        self._cum: list[float] = [0.0]

    def grow(self, n: int) -> None:
        if n > len(self.costs):
            new = [self._fn(i) for i in range(len(self.costs), n)]
            self.costs.extend(new)
            self._cum.extend(list(accumulate(new, initial=self._cum[-1]))[1:])

    def __call__(self, depth: int) -> float:
        """Recompute cost of the block at ``depth`` (0 = the first block of a prompt)."""
        if depth >= len(self.costs):
            self.grow(depth + 1)
        return self.costs[depth]

    def total(self, n: int) -> float:
        """Cost of the first ``n`` blocks of a prompt."""
        if n >= len(self._cum):
            self.grow(n)
        return self._cum[n]

    def of_depths(self, depths: Sequence[int]) -> float:
        """Cost of the blocks at these depths (ascending, all below a ``grow``n bound)."""
        cum = self._cum
        if depths and depths[-1] == len(depths) - 1:  # a leading run (the common case): one prefix sum
            return cum[len(depths)]
        # A difference of prefix sums per run, added in order: the compiled replay adds the same
        # terms in the same order, so both give the same float to the last bit.
        total, start, prev = 0.0, -1, -2
        for d in depths:
            if d != prev + 1:
                if start >= 0:
                    total += cum[prev + 1] - cum[start]
                start = d
            prev = d
        if start >= 0:
            total += cum[prev + 1] - cum[start]
        return total

    def prefix_sums(self, n: int) -> list[float]:
        """``total(0) .. total(n)``: the table the compiled replay reads."""
        self.grow(n)
        return self._cum[: n + 1]
