"""Fitting the cost model's efficiencies to measured steps (``kvemu calibrate``, bench/).

A measured step is its prefill chunks and decoders (``StepPoint``; one prefill alone and one
decode-only step are the two ends). Once the side of the roofline each step is on is known, its
time is linear in the inverse efficiencies and the fixed costs (``step_features``): products
over ``linear`` and ``decode_linear``, attention over ``attention``, the chunks' prefix read
over ``kv_read``, the weights and decoders' KV over ``memory`` and ``decode_kv``, and
``decode_seq_s`` a decoder, ``overhead_s`` an eager step, ``decode_overhead_s`` a graphed or
decode-only one.
The fit minimises the squared *relative* error over non-negative coefficients (exact
non-negative least squares, every subset of the terms tried); which side each step is on
depends on the fit, so a few rounds settle it. A term no point can see keeps its prior
efficiency; a term the fit sets to zero gets efficiency ``CAP`` (it costs nothing measurable).
Two forms of the decoders' products are tried, the better kept: on the roofline's compute
side at the prefill's ``linear`` (a GPU), or paid per sequence on top of the reads
(``decode_linear`` at the cap, the cost in ``decode_seq_s``: a CPU). A model reads the same
weights every step (an MoE model's routed experts are its MoE layers', priced apart), so graphed steps
cannot tell that read from their fixed cost: the read takes it all (``decode_overhead_s`` 0). The
MoE layers (shared/moe_cost.py: the efficiency's measured table, or its fitted constants) and the
all-reduces are known, not fitted: taken out of each step's seconds.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from shared.costmodel import CostModel, Efficiency, StepWork

CAP = 100.0  # efficiency given to a term the fit found to cost nothing
# (linear, decode_linear, attention, kv_read, memory, decode_kv, decode_seq_s, overhead_s, decode_overhead_s)
TERMS = ("linear", "decode_linear", "attention", "kv_read", "memory", "decode_kv", "decode_seq_s", "overhead_s",
         "decode_overhead_s")


@dataclass(frozen=True, slots=True)
class StepPoint:
    """One measured step: prefill chunks (new tokens, cached depth) and decoders (KV tokens each)."""

    chunks: tuple[tuple[int, int], ...]
    contexts: tuple[int, ...]  # per decoder, the KV tokens it attends
    seconds: float
    attention: bool = True  # False: a forward timed without its attention (Vidur's layer profiles)

    @property
    def work(self) -> StepWork:
        w = StepWork.of(self.chunks, len(self.contexts), sum(self.contexts))
        return w if self.attention else w._replace(attn_pairs=0.0)


@dataclass(frozen=True, slots=True)
class PrefillPoint:
    new_tokens: int
    cached_depth: int
    seconds: float

    @property
    def step(self) -> StepPoint:
        return StepPoint(((self.new_tokens, self.cached_depth),), (), self.seconds)


@dataclass(frozen=True, slots=True)
class DecodePoint:
    batch: int
    kv_tokens: int  # in all sequences together
    seconds: float

    @property
    def step(self) -> StepPoint:
        per, extra = divmod(self.kv_tokens, self.batch)
        return StepPoint((), tuple(per + (i < extra) for i in range(self.batch)), self.seconds)


def as_steps(points: Sequence[StepPoint | PrefillPoint | DecodePoint]) -> list[StepPoint]:
    return [p if isinstance(p, StepPoint) else p.step for p in points]


def nnls_relative(features: np.ndarray, seconds: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Non-negative coefficients minimising sum(w ((features @ coef) - seconds) / seconds)^2)."""
    a = features / seconds[:, None]
    b = np.ones(len(seconds))
    if weights is not None:
        root = np.sqrt(weights)
        a, b = a * root[:, None], b * root
    if len(b) > a.shape[1] + 1:
        # thousands of points (an operator profile): the triangle of [a | b]'s QR has the same
        # residual for every subset of columns, so each subset is solved on it, not on every row
        _, r = np.linalg.qr(np.column_stack([a, b]))
        a, b = r[:, :-1], r[:, -1]
    best, best_err = np.zeros(features.shape[1]), float("inf")
    cols = [j for j in range(features.shape[1]) if np.any(features[:, j] > 0)]
    for k in range(1, len(cols) + 1):
        for subset in itertools.combinations(cols, k):
            coef, *_ = np.linalg.lstsq(a[:, subset], b, rcond=None)
            if np.any(coef < 0):
                continue
            err = float(np.sum((a[:, subset] @ coef - b) ** 2))
            if err < best_err:
                best_err, best = err, np.zeros(features.shape[1])
                best[list(subset)] = coef
    return best


def _inverse(coef: float, seen: bool, prior: float) -> float:
    if not seen:
        return prior
    return CAP if coef <= 1.0 / CAP else float(1.0 / coef)


_UNIT = Efficiency(1.0, 1.0, 1.0, 1.0, 0.0, 0.0)


def step_features(cost: CostModel, steps: Sequence[StepPoint]) -> tuple[np.ndarray, np.ndarray]:
    """Per step, at efficiency 1: its terms in ``TERMS`` order (both sides of the roofline),
    then the decoders' attention (on the compute side) and the prefill chunks; and each step's known seconds (the
    all-reduces, priced from the link, and the MoE layers, from the efficiency's MoE table or constants)."""
    e = cost.efficiency
    unit = cost.with_efficiency(replace(_UNIT, graph_tokens=e.graph_tokens, moe_floor_s=e.moe_floor_s,
                                        moe_memory=e.moe_memory_eff, moe_linear=e.moe_linear_eff, moe_table=e.moe_table))
    layers, graph_tokens = cost.model.layers, cost.efficiency.graph_tokens
    rows, known = [], []
    for s in steps:
        w = s.work
        p = unit.step_parts(w)
        decode_lin = p.linear * w.decoders / w.tokens  # at efficiency 1 a decode token's products are a prefill token's
        graphed = w.tokens <= graph_tokens or not w.prefill_seqs  # the form's rule (CostModel.step_parts)
        rows.append([p.linear - decode_lin + p.head, decode_lin, p.attention, p.kv_read, p.weights, p.decode_kv,
                     w.decoders * layers, 0.0 if graphed else layers, layers if graphed else 0.0, p.decode_attention,
                     w.prefill_seqs])
        known.append(p.comm + p.moe)
    return np.array(rows, dtype=float), np.array(known, dtype=float)


def _fit_round(x_all: np.ndarray, seconds: np.ndarray, eff: Efficiency, products_per_seq: bool,
               weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Each step on the side of the roofline ``eff`` puts it on: the coefficients, and which
    terms some step could see. A decode-only step on the compute side prices its products and
    attention at ``eff`` (known): the products' rates are fitted on steps that prefill."""
    memory = x_all[:, 4] / eff.memory + x_all[:, 5] / eff.decode_kv_eff
    compute = x_all[:, 0] / eff.linear + x_all[:, 1] / eff.decode_linear_eff + x_all[:, 9] / eff.attention
    memory_side = memory >= compute
    x = x_all[:, :9].copy()
    x[memory_side, 0:2] = 0.0  # the products hide under the reads
    x[~memory_side, 4:6] = 0.0  # the reads hide under the products
    x[~memory_side, 2] += x_all[~memory_side, 9]  # decode attention counts on the compute side
    held = ~memory_side & (x_all[:, 10] == 0)
    rest = seconds.copy()
    rest[held] = np.maximum(seconds[held] - compute[held], seconds[held] * 1e-3)
    x[held, 0:3] = 0.0
    if products_per_seq:
        x[:, 1] = 0.0  # at the cap: the decoders' products cost what decode_seq_s says
    else:
        x[:, 0] += x[:, 1]  # decode products at the prefill's `linear`
        x[:, 1] = 0.0
    return nnls_relative(x, rest, weights), np.any(x > 0, axis=0)


def fit(cost: CostModel, points: Sequence[StepPoint | PrefillPoint | DecodePoint], source: str = "",
        rounds: int = 6, decode: Sequence[DecodePoint] = (), weights: Sequence[float] | None = None) -> Efficiency:
    """``cost``'s efficiency with every term of the step form fitted to ``points`` (and ``decode``,
    kept for callers that pass prefill and decode points apart); ``weights``, one a point of
    ``points``, weigh their squared relative errors (default: all 1)."""
    steps = as_steps([*points, *decode])
    # the MoE layers are known at the prior's rates: pinned, so that fitting `memory` and `linear` leaves them be
    cost = cost.with_efficiency(replace(cost.efficiency, moe_memory=cost.efficiency.moe_memory_eff,
                                        moe_linear=cost.efficiency.moe_linear_eff))
    w = None if weights is None else np.concatenate([np.asarray(weights, dtype=float), np.ones(len(decode))])
    x_all, known = step_features(cost, steps)
    seconds = np.maximum(np.array([s.seconds for s in steps]) - known, 1e-12)
    prior = cost.efficiency
    x_all[:, 8] = 0.0  # graphed steps: the weight read (the same every step) takes the fixed cost
    best, best_err = prior, float("inf")
    for per_seq in (False, True):
        eff = replace(prior, decode_linear=CAP if per_seq else None)
        for _ in range(rounds):
            coef, seen = _fit_round(x_all, seconds, eff, per_seq, w)
            eff = replace(eff, linear=_inverse(coef[0], seen[0], prior.linear),
                          attention=_inverse(coef[2], seen[2], prior.attention),
                          kv_read=_inverse(coef[3], seen[3], prior.kv_read),
                          memory=_inverse(coef[4], seen[4], prior.memory),
                          decode_kv=_inverse(coef[5], seen[5], prior.decode_kv_eff) if seen[5] else prior.decode_kv,
                          decode_seq_s=float(coef[6]), overhead_s=float(coef[7]) if seen[7] else prior.overhead_s,
                          decode_overhead_s=float(coef[8]), source=source or prior.source)
            fitted = cost.with_efficiency(eff)
            rel = np.array([fitted.step_time(s.work) / s.seconds - 1 for s in steps])
            err = float(np.sum(rel**2 if w is None else w * rel**2))
            if err < best_err:
                best, best_err = eff, err
    return best


def errors(predicted: Sequence[float], measured: Sequence[float]) -> dict:
    """Per-point relative errors (predicted / measured - 1) and their mean / max magnitude."""
    rel = [p / m - 1.0 for p, m in zip(predicted, measured)]
    mags = [abs(r) for r in rel]
    return {"per_point": [round(r, 4) for r in rel], "mean_abs": round(sum(mags) / len(mags), 4) if mags else 0.0,
            "max_abs": round(max(mags), 4) if mags else 0.0}
