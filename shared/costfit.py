"""Fitting the cost model's efficiencies to measured times (``kvemu calibrate``, bench/).

Each prefill time is linear in the inverse efficiencies once the parts are computed at
efficiency 1: ``t = linear/e_lin + attention/e_att + kv_read/e_kv + layers *
overhead``. The fit minimises the squared *relative* error over non-negative coefficients
(exact non-negative least squares by trying every subset of the terms: there are four). A
term the points cannot see (e.g. no point with a cached prefix) keeps its prior efficiency;
a term the fit sets to zero gets efficiency ``CAP`` (it costs nothing measurable).
Decode steps fit ``memory`` (weights), ``decode_kv`` (KV reads), ``decode_seq_s`` and
``decode_overhead_s`` the same way, with the compute side of their roofline held at the
prefill efficiencies (``fit`` alternates the two fits).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from shared.costmodel import CostModel, Efficiency

CAP = 100.0  # efficiency given to a term the fit found to cost nothing
_UNIT = Efficiency(1.0, 1.0, 1.0, 1.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class PrefillPoint:
    new_tokens: int
    cached_depth: int
    seconds: float


@dataclass(frozen=True, slots=True)
class DecodePoint:
    batch: int
    kv_tokens: int  # in all sequences together
    seconds: float


def nnls_relative(features: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Non-negative coefficients minimising sum(((features @ coef) - seconds) / seconds)^2."""
    a = features / seconds[:, None]
    b = np.ones(len(seconds))
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


def prefill_features(cost: CostModel, points: Sequence[PrefillPoint]) -> np.ndarray:
    unit = cost.with_efficiency(_UNIT)
    rows = []
    for p in points:
        parts = unit.prefill_parts(p.new_tokens, p.cached_depth)
        rows.append([parts.linear, parts.attention, parts.kv_read, cost.model.layers])
    return np.array(rows, dtype=float)


def fit_prefill(cost: CostModel, points: Sequence[PrefillPoint], source: str = "", rounds: int = 4) -> Efficiency:
    """``cost``'s efficiency with the prefill terms fitted to ``points``. A point whose weight
    read (at ``cost``'s ``memory`` efficiency, fitted on decode steps) outlasts its products is
    on the memory side of the roofline: its weight read is taken as known and its products
    drop out of the fit. Which side a point is on depends on the fit: a few rounds settle it."""
    x_all = prefill_features(cost, points)
    seconds = np.array([p.seconds for p in points])
    weights = np.array([cost.prefill_parts(p.new_tokens, p.cached_depth).weights for p in points])
    prior = eff = cost.efficiency
    seen = np.any(x_all > 0, axis=0)
    for _ in range(rounds):
        memory_side = weights > x_all[:, 0] / eff.linear
        x = x_all.copy()
        x[memory_side, 0] = 0.0
        rest = np.where(memory_side, np.maximum(seconds - weights, seconds * 1e-3), seconds)
        coef = nnls_relative(x, rest)
        eff = replace(prior, linear=_inverse(coef[0], seen[0], prior.linear),
                      attention=_inverse(coef[1], seen[1], prior.attention),
                      kv_read=_inverse(coef[2], seen[2], prior.kv_read),
                      overhead_s=float(coef[3]), source=source or prior.source)
    return eff


def decode_features(cost: CostModel, points: Sequence[DecodePoint]) -> np.ndarray:
    """Per point, at efficiency 1: the memory side's weight and KV reads, then the terms outside
    the roofline (sequences x layers, layers)."""
    unit, m = cost.with_efficiency(_UNIT), cost.model
    kv_unit = cost.kv_bytes_per_token / (cost.gpu.hbm_bandwidth * cost.tp)
    return np.array([[unit.decode_weights_time(p.batch), p.kv_tokens * kv_unit, p.batch * m.layers, m.layers]
                     for p in points], dtype=float)


def fit_decode(cost: CostModel, points: Sequence[DecodePoint], rounds: int = 4) -> Efficiency:
    """``cost``'s efficiency with the decode terms fitted to ``points``: ``memory`` (weights),
    ``decode_kv`` (KV reads), ``decode_seq_s``, ``decode_overhead_s``, and whether the products
    overlap the reads (the roofline's compute side at the prefill efficiencies, as on a GPU)
    or are paid per sequence on top of them (``decode_linear`` at the cap, as on a CPU).
    A point whose products outlast its reads drops its reads from the fit; a few rounds
    settle which side each point is on; the fit with the least squared relative error wins."""
    x_all = decode_features(cost, points)
    seconds = np.array([p.seconds for p in points])
    prior = cost.efficiency
    seen_kv = bool(np.any(x_all[:, 1] > 0))
    if np.ptp(x_all[:, 0]) <= 1e-9 * np.max(x_all[:, 0]):
        # A dense model reads the same weights every step: the points cannot tell that read from
        # a per-layer overhead, so the read takes it all (the GPU form: no decode overhead).
        x_all[:, 3] = 0.0
    best, best_err = prior, float("inf")
    for products in (None, CAP):  # products at the prefill's `linear`, or paid per sequence
        eff = replace(prior, decode_linear=products)
        for _ in range(rounds):
            compute = np.array([cost.with_efficiency(eff).decode_compute_time(p.batch, p.kv_tokens) for p in points])
            compute_side = compute > x_all[:, 0] / eff.memory + x_all[:, 1] / eff.decode_kv_eff
            x = x_all.copy()
            x[compute_side, :2] = 0.0
            coef = nnls_relative(x, np.where(compute_side, np.maximum(seconds - compute, seconds * 1e-3), seconds))
            eff = replace(eff, memory=_inverse(coef[0], True, prior.memory),
                          decode_kv=_inverse(coef[1], seen_kv, prior.decode_kv_eff),
                          decode_seq_s=float(coef[2]), decode_overhead_s=float(coef[3]))
            fitted = cost.with_efficiency(eff)
            err = sum((fitted.decode_step_time(p.batch, p.kv_tokens) / p.seconds - 1) ** 2 for p in points)
            if err < best_err:
                best, best_err = eff, err
    return best


def fit(cost: CostModel, prefill: Sequence[PrefillPoint], decode: Sequence[DecodePoint], source: str = "",
        passes: int = 2) -> Efficiency:
    """Decode and prefill terms fitted together: each fit holds the other's terms (prefill's
    weight read uses ``memory``; decode's compute side uses ``linear`` and ``attention``), so
    they alternate."""
    eff = cost.efficiency
    for _ in range(passes):
        eff = fit_decode(cost.with_efficiency(eff), decode) if decode else eff
        eff = fit_prefill(cost.with_efficiency(eff), prefill, source) if prefill else eff
    return eff


def errors(predicted: Sequence[float], measured: Sequence[float]) -> dict:
    """Per-point relative errors (predicted / measured - 1) and their mean / max magnitude."""
    rel = [p / m - 1.0 for p, m in zip(predicted, measured)]
    mags = [abs(r) for r in rel]
    return {"per_point": [round(r, 4) for r in rel], "mean_abs": round(sum(mags) / len(mags), 4) if mags else 0.0,
            "max_abs": round(max(mags), 4) if mags else 0.0}
