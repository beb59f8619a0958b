"""Bounded-memory latency histogram: log buckets 1% wide, quantiles within 1%."""

from __future__ import annotations

import math

_GROWTH = 1.01
_LOG_GROWTH = math.log(_GROWTH)
_FLOOR = 1e-6  # values below a microsecond share the first bucket


class LogHistogram:
    __slots__ = ("counts", "n", "total", "min", "max")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.n = 0
        self.total = 0.0
        self.min = math.inf
        self.max = -math.inf

    def add(self, value: float) -> None:
        v = value if value > _FLOOR else _FLOOR
        k = int(math.log(v / _FLOOR) / _LOG_GROWTH)
        self.counts[k] = self.counts.get(k, 0) + 1
        self.n += 1
        self.total += value
        if value < self.min:
            self.min = value
        if value > self.max:
            self.max = value

    def quantile(self, q: float) -> float:
        """The q-quantile (nearest rank), clamped to the exact observed min and max."""
        if self.n == 0:
            return 0.0
        rank = max(1, math.ceil(q * self.n))
        seen = 0
        for k in sorted(self.counts):
            seen += self.counts[k]
            if seen >= rank:
                mid = _FLOOR * _GROWTH ** (k + 0.5)
                return min(max(mid, self.min), self.max)
        return self.max

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0

    def merge(self, other: LogHistogram) -> None:
        for k, c in other.counts.items():
            self.counts[k] = self.counts.get(k, 0) + c
        self.n += other.n
        self.total += other.total
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)

    def summary(self) -> dict:
        return {"count": self.n, "mean": self.mean, "p50": self.quantile(0.5), "p90": self.quantile(0.9),
                "p99": self.quantile(0.99), "max": self.max if self.n else 0.0}
