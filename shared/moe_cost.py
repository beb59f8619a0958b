"""The fused-MoE layer of a step: what its kernels cost at the step's token count, from measurements.

vLLM runs an MoE layer as one fused kernel pair (grouped GEMMs over the experts the step's tokens
route to) after the router's top-k, with a token sort and alignment per expert. At a few tokens
that is not the touched experts' weight bytes over the bandwidth: NVIDIA's aiconfigurator tables
(vLLM 0.19.0's ``fused_moe`` on one H200, bench/data/aiconfigurator) put one token of
Qwen3-30B-A3B's layer (8 of 128 experts of 2048 x 768) at 37.4 us, where its 75.5 MB of expert
weights take 15.7 us at the full 4.8 TB/s. Two forms price it:

* measured constants (``MoeKernel``, fitted by bench/fit_moe.py): a fixed cost per layer and step
  (routing, top-k, the sort, the kernels' launches), then the touched experts' weights at a fraction
  of HBM bandwidth or the tokens' products at a fraction of peak FLOP/s, whichever is slower;
* a measured table (``MoeTable``, an operator profile's ``moe.csv``: microseconds by tokens and
  experts touched), interpolated as LLMServingSim's simulator reads it: linearly in tokens at each
  profiled expert count, then linearly across expert counts, extended from the two outermost samples.

Both are one GPU's layer at (tokens, whole experts that GPU holds and the step touches): under
``--tp`` each GPU holds a 1/tp slice of every expert, which reads and computes what 1/tp of the
experts and tokens would (``CostModel`` asks at tokens / tp, experts / tp); under expert
parallelism a rank asks at the tokens dispatched to it and its own touched experts.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from shared.errors import InputError

FIELD = "moe_table"
Row = tuple[float, float, float]  # tokens, experts touched, microseconds


class MoeFit(NamedTuple):
    """The form's constants: a layer's fixed cost, and the fractions of HBM bandwidth and of peak FLOP/s."""

    floor_s: float
    memory: float
    linear: float


# Fitted by bench/fit_moe.py on aiconfigurator's H200 table of vLLM 0.19.0's fused_moe (bf16), Qwen3-30B-A3B's
# layer, balanced routing, one GPU: 27 token counts, 1 to 16,384 (docs/calibration.md, "The fused-MoE layer").
# Every MoE preset's efficiency carries them (tiny-moe's too: no smaller shape was measured); on another GPU
# they scale with its datasheet bandwidth and peak.
FUSED_MOE_H200 = MoeFit(17.04e-6, 0.822, 0.4459)


def table_rows(raw: Iterable) -> tuple[Row, ...]:
    """``raw`` (a profile's JSON lists, or tuples) as rows of three finite numbers: tokens >= 1, experts >= 1,
    microseconds >= 0, no (tokens, experts) twice. Refused naming the row otherwise."""
    rows: list[Row] = []
    seen: set[tuple[float, float]] = set()
    for i, row in enumerate(raw):
        try:
            t, e, us = (float(v) for v in row)
        except (TypeError, ValueError):
            raise InputError(FIELD, f"row {i}: {row!r} is not [tokens, experts, microseconds]") from None
        if not (1 <= t < float("inf") and 1 <= e < float("inf") and 0 <= us < float("inf")):
            raise InputError(FIELD, f"row {i}: {row!r}: tokens and experts must be >= 1, microseconds >= 0")
        if (t, e) in seen:
            raise InputError(FIELD, f"row {i}: {t:g} tokens over {e:g} experts is given twice")
        seen.add((t, e))
        rows.append((t, e, us))
    return tuple(rows)


def interp_line(xs: Sequence[float], ys: Sequence[float], at: float) -> float:
    """Linear in ``xs`` (ascending, distinct), extended from the two last (or first) samples outside them;
    one sample: its value (``profiles_llmservingsim.interp``, one point at a time)."""
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect_left(xs, at), 1), len(xs) - 1)
    x0, x1 = xs[i - 1], xs[i]
    return ys[i - 1] + (ys[i] - ys[i - 1]) * (at - x0) / (x1 - x0)


@dataclass(frozen=True, slots=True)
class MoeTable:
    """A measured MoE layer, by profiled expert count (ascending), each with its token counts and times."""

    levels: tuple[float, ...]
    tokens: tuple[tuple[float, ...], ...]
    us: tuple[tuple[float, ...], ...]

    @classmethod
    def of(cls, rows: Iterable) -> MoeTable:
        checked = sorted(table_rows(rows), key=lambda r: (r[1], r[0]))
        if not checked:
            raise InputError(FIELD, "no rows")
        levels = tuple(sorted({e for _, e, _ in checked}))
        tokens = tuple(tuple(t for t, e, _ in checked if e == lv) for lv in levels)
        us = tuple(tuple(u for _, e, u in checked if e == lv) for lv in levels)
        return cls(levels, tokens, us)

    def us_at(self, tokens: float, experts: float) -> float:
        at_level = [interp_line(t, u, tokens) for t, u in zip(self.tokens, self.us)]
        return interp_line(self.levels, at_level, experts)

    def token_slope_us(self) -> float:
        """Microseconds a token where the table runs out: its largest expert count's last two token counts
        (what the interpolation extends beyond them), at least 0."""
        t, u = self.tokens[-1], self.us[-1]
        return max((u[-1] - u[-2]) / (t[-1] - t[-2]), 0.0) if len(t) > 1 else 0.0


@dataclass(frozen=True, slots=True)
class MoeKernel:
    """One GPU's MoE layer: ``floor_s + max(experts x expert_s, tokens x token_s)``, or ``table`` where given."""

    floor_s: float  # routing, top-k, the sort and alignment, the kernels' launches: a layer and step
    expert_s: float  # one whole expert's weights at the kernel's read rate
    token_s: float  # one token's products over its active experts at the kernel's rate
    table: MoeTable | None = None

    @classmethod
    def of(cls, floor_s: float, memory: float, linear: float, table: Iterable, expert_bytes: float,
           token_flops: float, hbm_bandwidth: float, peak_flops: float) -> MoeKernel:
        """From the efficiency's fractions and one GPU's rates (``memory`` of its HBM bandwidth, ``linear`` of its
        peak FLOP/s), or from a measured table when ``table`` has rows."""
        rows = tuple(table)
        return cls(floor_s, expert_bytes / (hbm_bandwidth * memory), token_flops / (peak_flops * linear),
                   MoeTable.of(rows) if rows else None)

    def seconds(self, tokens: float, experts: float) -> float:
        """One layer at ``tokens`` tokens touching ``experts`` whole experts; 0.0 with no token."""
        if tokens <= 0:
            return 0.0
        if self.table is not None:
            return max(self.table.us_at(tokens, experts), 0.0) * 1e-6
        return self.floor_s + max(experts * self.expert_s, tokens * self.token_s)

    def token_slope_s(self) -> float:
        """A token's share of a long prefill's MoE layer: its products (what a recomputed block costs)."""
        return self.table.token_slope_us() * 1e-6 if self.table is not None else self.token_s
