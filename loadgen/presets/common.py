"""What every workload preset shares: parameter checks, length/popularity distributions, the sessions'
block hashes (``loadgen/presets/build.py`` turns sampled sessions into trace requests with them).

Token-stream model: a session is an append-only stream
``system prompt | prompt_0 | response_0 | prompt_1 | response_1 | ...``; turn j's input is the
stream up to and including ``prompt_j``.  Only full blocks are hashed.  Block k gets the
content id of the system prompt when it lies entirely inside it (so sessions that share a
prompt share those hashes), else ``content_id(ns, session, k)``; ids are chained with
``chain_ids``, so block k has the same hash in every later turn of its session.

Timing model: turn j+1 arrives ``gap`` seconds after turn j *arrived*.  The gap stands for
think time plus service time; service time is not modelled, so a trace does not depend on
how fast a cluster would serve it.  Sessions *start* in [0, duration); later turns may run
past the end.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from shared.errors import InputError
from shared.hashing import ROOT_HASH, chain_ids, content_id
from shared.validate import check_int, check_number, check_positive, check_probability

if TYPE_CHECKING:
    from loadgen.presets.fanout import FanOut

Progress = Callable[[int, int], None]

# ---------------------------------------------------------------- parameter checks


def require_positive(obj, *names: str) -> None:
    for name in names:
        check_positive(name, getattr(obj, name))


def require_nonnegative(obj, *names: str) -> None:
    for name in names:
        check_number(name, getattr(obj, name), minimum=0)


def require_probability(obj, *names: str) -> None:
    for name in names:
        check_probability(name, getattr(obj, name))


def require_int(obj, name: str, minimum: int, maximum: int | None = None) -> None:
    check_int(name, getattr(obj, name), minimum, maximum)


def require_increasing(obj, *names: str) -> None:
    """Quantile-style parameters: positive and strictly increasing in the order given."""
    require_positive(obj, *names)
    for prev, name in zip(names, names[1:]):
        if getattr(obj, name) <= getattr(obj, prev):
            raise InputError(name, f"must be greater than {prev} ({getattr(obj, prev)}), got {getattr(obj, name)}")


# ---------------------------------------------------------------- distributions


def lognormal(rng: np.random.Generator, median: float, sigma: float, size: int) -> np.ndarray:
    return median * np.exp(sigma * rng.standard_normal(size))


def lognormal_int(rng, median: float, sigma: float, size: int, lo: int = 1, hi: int | None = None) -> np.ndarray:
    return np.clip(np.rint(lognormal(rng, median, sigma, size)), lo, hi).astype(np.int64)


def zipf_mandelbrot_probs(n: int, s: float, q: float) -> np.ndarray:
    """P(rank r) ∝ (r + q)^-s for r = 1..n."""
    w = (np.arange(1, n + 1, dtype=np.float64) + q) ** -s
    return w / w.sum()


def poisson_starts(rng: np.random.Generator, rate: float, duration_s: float) -> np.ndarray:
    """Arrival times of a Poisson process on [0, duration): a Poisson count, uniformly placed."""
    n = int(rng.poisson(rate * duration_s))
    return np.sort(rng.uniform(0.0, duration_s, n))


def piecewise_pareto_quantile(u: np.ndarray, points: list[tuple[float, float]], x_max: float) -> np.ndarray:
    """Inverse CDF through published quantiles ``(u_i, x_i)`` (first u must be 0).

    log x is linear in -log(1-u) between points, i.e. each segment is a power-law tail,
    so the distribution hits every given quantile exactly and stays heavy-tailed between
    them.  Beyond the last point the last segment's slope continues, capped at ``x_max``.
    """
    up = np.array([p[0] for p in points])
    lx = np.log([p[1] for p in points])
    v = -np.log1p(-np.asarray(u))
    vp = -np.log1p(-up)
    out = np.interp(v, vp, lx)
    slope = (lx[-1] - lx[-2]) / (vp[-1] - vp[-2])
    out = np.where(v > vp[-1], lx[-1] + slope * (v - vp[-1]), out)
    return np.minimum(np.exp(out), x_max)


def _rounded_lognormal_cdf(median: float, sigma: float, max_value: int) -> np.ndarray:
    """P(M <= m) for m = 1..max_value, M = clip(round(X), 1, max_value), X ~ LN(median, sigma)."""
    m = np.arange(1, max_value + 1, dtype=np.float64)
    if sigma == 0:
        cdf = (m + 0.5 > median).astype(np.float64)
    else:
        z = (np.log(m + 0.5) - math.log(median)) / (sigma * math.sqrt(2.0))
        cdf = 0.5 * (1.0 + np.array([math.erf(v) for v in z]))
    cdf[-1] = 1.0
    return cdf


def rounded_lognormal_mean(median: float, sigma: float, max_value: int) -> float:
    cdf = _rounded_lognormal_cdf(median, sigma, max_value)
    # E[M] = sum over m >= 0 of P(M > m)
    return float(1.0 + np.sum(1.0 - cdf[:-1]))


@functools.lru_cache(maxsize=64)
def rounded_lognormal_sigma(median: float, mean: float, max_value: int, field: str = "turns_mean") -> float:
    """Spread of the log-normal whose rounded, clipped value has exactly this mean.

    Users think of turn counts as "median 3, mean 7" (ShareGPT); this turns that pair into
    the log-space spread, accounting for rounding and the ``max_value`` cap.
    """
    lo, hi = 0.0, 4.0
    if not rounded_lognormal_mean(median, lo, max_value) <= mean <= rounded_lognormal_mean(median, hi, max_value):
        raise InputError(field, f"mean {mean} is not reachable with median {median} and maximum {max_value}")
    for _ in range(60):
        mid = (lo + hi) / 2
        if rounded_lognormal_mean(median, mid, max_value) < mean:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def sample_turns(rng, median: float, mean: float, max_value: int, size: int) -> np.ndarray:
    sigma = rounded_lognormal_sigma(float(median), float(mean), int(max_value))
    return np.clip(np.rint(lognormal(rng, median, sigma, size)), 1, max_value).astype(np.int64)


# ---------------------------------------------------------------- sessions


@dataclass(frozen=True)
class Catalog:
    """System prompts of one profile: a fixed length per entry and a popularity law."""

    labels: list[str]
    tokens: np.ndarray
    probs: np.ndarray

    def pick(self, rng: np.random.Generator, size: int) -> np.ndarray:
        if not self.labels:
            return np.full(size, -1, dtype=np.int64)
        return rng.choice(len(self.labels), size=size, p=self.probs).astype(np.int64)


def sample_catalog(rng, label: str, n: int, median: float, sigma: float, zipf_s: float, zipf_q: float) -> Catalog:
    tokens = lognormal_int(rng, median, sigma, n) if n else np.zeros(0, dtype=np.int64)
    return Catalog([f"{label}/{i}" for i in range(n)], tokens, zipf_mandelbrot_probs(n, zipf_s, zipf_q) if n else np.zeros(0))


@dataclass
class SessionBatch:
    """Sampled sessions, column-wise.  Per-turn arrays are grouped by session in order."""

    kind: np.ndarray  # per session, "single" | "multi" | "agent"
    start: np.ndarray  # per session, seconds
    turns: np.ndarray  # per session, >= 1
    sys_idx: np.ndarray  # per session, index into sys_tokens / sys_labels, -1 = none
    prompt: np.ndarray  # per turn: new prompt tokens
    output: np.ndarray  # per turn: response tokens
    gap: np.ndarray  # per turn: seconds since the previous turn arrived (0 for turn 0)
    sys_tokens: np.ndarray
    sys_labels: list[str]
    # per session index: its fan-outs (loadgen/presets/fanout.py), the agent profile's parallel tool calls and
    # subagents; None or absent: the session's turns follow one another
    fanouts: dict[int, tuple[FanOut, ...]] | None = None

    def offsets(self) -> np.ndarray:
        return (np.cumsum(self.turns) - self.turns).astype(np.int64)

    def turn_session(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.turns)), self.turns)

    @staticmethod
    def concat(batches: list[SessionBatch]) -> SessionBatch:
        shift = np.cumsum([0] + [len(b.sys_labels) for b in batches])
        sys_idx = [np.where(b.sys_idx >= 0, b.sys_idx + k, -1) for b, k in zip(batches, shift)]

        def cat(name):
            return np.concatenate([getattr(b, name) for b in batches])

        firsts = np.cumsum([0] + [len(b.turns) for b in batches])
        fanouts = {s + int(first): fans for b, first in zip(batches, firsts) for s, fans in (b.fanouts or {}).items()}
        return SessionBatch(
            kind=cat("kind"), start=cat("start"), turns=cat("turns"), sys_idx=np.concatenate(sys_idx),
            prompt=cat("prompt"), output=cat("output"), gap=cat("gap"), sys_tokens=cat("sys_tokens"),
            sys_labels=[label for b in batches for label in b.sys_labels], fanouts=fanouts or None,
        )

    def select_turns(self, keep: np.ndarray) -> SessionBatch:
        """Drop turns (``keep`` must keep a non-empty prefix of every session)."""
        turns = np.bincount(self.turn_session()[keep], minlength=len(self.turns)).astype(np.int64)
        fanouts = None
        if self.fanouts:  # a fan-out stays while the turn that joins it does
            kept = {s: tuple(f for f in fans if f.turn + 1 < turns[s]) for s, fans in self.fanouts.items()}
            fanouts = {s: fans for s, fans in kept.items() if fans} or None
        return SessionBatch(self.kind, self.start, turns, self.sys_idx, self.prompt[keep], self.output[keep],
                            self.gap[keep], self.sys_tokens, self.sys_labels, fanouts)

    def sorted_by_start(self) -> SessionBatch:
        order = np.argsort(self.start, kind="stable")
        turns = self.turns[order]
        new_off = np.cumsum(turns) - turns
        idx = np.arange(int(turns.sum())) + np.repeat(self.offsets()[order] - new_off, turns)
        fanouts = None
        if self.fanouts:
            place = np.empty(len(order), dtype=np.int64)
            place[order] = np.arange(len(order))
            fanouts = {int(place[s]): fans for s, fans in self.fanouts.items()}
        return SessionBatch(self.kind[order], self.start[order], turns, self.sys_idx[order], self.prompt[idx],
                            self.output[idx], self.gap[idx], self.sys_tokens, self.sys_labels, fanouts)

    def sys_len(self) -> np.ndarray:
        return np.where(self.sys_idx >= 0, self.sys_tokens[np.maximum(self.sys_idx, 0)] if len(self.sys_tokens) else 0, 0)

    def input_tokens(self) -> np.ndarray:
        """Per turn: system prompt + all earlier prompts and responses + this prompt."""
        grown = self.prompt + self.output
        before = segmented_cumsum(grown, self.turns) - grown
        return before + self.sys_len()[self.turn_session()] + self.prompt


def make_batch(kind, start, turns, sys_idx, prompt, output, gap, catalog: Catalog) -> SessionBatch:
    """``kind`` is one name for every session or a per-session array of names."""
    turns = np.asarray(turns, dtype=np.int64)
    kinds = np.full(len(turns), kind, dtype="<U6") if isinstance(kind, str) else np.asarray(kind, dtype="<U6")
    gap = np.asarray(gap, dtype=np.float64).copy()
    gap[np.cumsum(turns) - turns] = 0.0
    return SessionBatch(kinds, np.asarray(start, dtype=np.float64), turns,
                        np.asarray(sys_idx, dtype=np.int64), np.asarray(prompt, dtype=np.int64),
                        np.asarray(output, dtype=np.int64), gap, catalog.tokens, list(catalog.labels))


def truncate_context(batch: SessionBatch, max_context: int) -> SessionBatch:
    """End a session at the turn whose input would exceed the model's context window."""
    first = np.zeros(len(batch.prompt), dtype=bool)
    first[batch.offsets()[batch.turns > 0]] = True
    return batch.select_turns((batch.input_tokens() <= max_context) | first)


def segmented_cumsum(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Inclusive cumulative sum restarting at each group of ``lengths`` consecutive items."""
    cs = np.cumsum(values)
    if not len(cs):
        return cs
    ends = np.cumsum(lengths)
    base = np.concatenate(([0], cs[ends[:-1] - 1])) if len(lengths) else cs[:0]
    return cs - np.repeat(base, lengths)


def block_content_ids(ns: str, owner: tuple[str, ...], start: int, stop: int) -> list[int]:
    """Content ids of blocks ``start..stop-1`` of one token stream (a session or a system prompt).

    Block k's id is ``content_id(ns, *owner) + k`` (mod 2**64): a fixed function of (owner, k),
    computed without a string hash per block.  Neighbouring owners' id ranges could only
    overlap if their bases were within a few thousand of each other (~1e-6 per trace), and even
    then chaining from different parents keeps the block hashes distinct.
    """
    base = np.uint64(content_id(ns, *owner))
    return (np.arange(start, stop, dtype=np.uint64) + base).tolist()


def _session_chain(ns: str, name: str, n_blocks: int, sys_chain: list[int]) -> list[int]:
    """Hashes of a session's ``n_blocks`` first blocks; the longest turn contains all others."""
    shared = sys_chain[:n_blocks]
    parent = shared[-1] if shared else ROOT_HASH
    return shared + chain_ids(block_content_ids(ns, (name,), len(shared), n_blocks), parent)
