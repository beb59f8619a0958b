"""Mean-field hit ratio of whole-conversation LRU for multi-turn sessions, after the mean-field
LRU analysis of multi-turn conversations (docs/sources.md).

The paper's multi-turn conversation model (MCM): sessions arrive as a Poisson process of
rate λ; a session has M turns; turn j's prompt holds R_j = Z_1 + ... + Z_j blocks (its whole
history plus the new prompt); the prompt of turn j+1 arrives W after the prompt of turn j,
W i.i.d. with CDF F.  With

    A_R  = E[Σ_{j<=M} R_j]     every prompt block of a session (the hit ratio's denominator)
    A_H  = E[Σ_{j<M}  R_j]     the history a next turn can reuse
    E[B] = E[R_M]              blocks a session ever inserts

and capacity N blocks, the characteristic time T_C solves

    d(t) = λ0·E[B]·t + λ0·A_H·∫0^t F̄(u)du = 1,    λ0 = λ / N,

and the hit ratio (hit blocks / prompt blocks) is h = (A_H / A_R)·F(T_C), at most
h_max = A_H / A_R.  The practical variant (a partial, unhashable tail block per turn)
replaces A_H by A_H^hash = A_H − E[M−1], both in d(t) and in h.

Everything is in closed form except T_C: ∫0^t F̄(u)du is evaluated as E[min(W, t)], which
every distribution here has exactly (no quadrature, so heavy tails cost nothing), and d is
continuous and strictly increasing, so bisection on a bracket always converges.  The inverse
(capacity for a target h) needs no search at all: T* = F⁻¹(h / h_max) and N = λ·(E[B]·T* +
A_H·E[min(W, T*)]).

In kvemu terms h is ``kvemu sim --policy session_lru --response-kv drop``'s ``block_hit_ratio``
(``bench/validate_estimate.py`` runs exactly that): turn j's request hashes R_j blocks; the KV
of a response is not cached (the paper's prefill instance keeps prompt blocks only; kvemu's
default, a colocated vLLM's, keeps it) and returns as part of the next prompt; a
preset's think time is measured prompt arrival to prompt arrival, which is exactly W (the
paper's experiment instead waited for decoding to end, W = max(clock, service)).  The
simulator's queueing delays do not change h: whole-session LRU depends on the order of
accesses only, and admission is FCFS.  The scm preset's blocks are all full (block-size
multiples), so kvemu matches the theoretical variant; the practical one is for engines that
also hold a partial tail block per turn.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

from loadgen.presets.common import require_int, require_positive
from loadgen.presets.scm import ScmPreset, check_scm_conversations
from loadgen.trace import Trace
from shared.errors import InputError
from shared.kv_groups import FULL, STATE, WINDOW, KvGroups

_STD_NORMAL = NormalDist()

# ---------------------------------------------------------------- think-time distributions


class ThinkTime(ABC):
    """The prompt interarrival W within a session: CDF, E[min(W, t)] and quantile."""

    name = "?"

    @abstractmethod
    def cdf(self, t: float) -> float: ...

    @abstractmethod
    def mean_min(self, t: float) -> float:
        """E[min(W, t)] = ∫0^t F̄(u)du."""

    @abstractmethod
    def quantile(self, u: float) -> float:
        """Smallest t with F(t) >= u, for 0 < u <= 1 (inf if F never reaches u)."""

    def mean(self) -> float:
        return self.mean_min(math.inf)

    def describe(self) -> dict:
        return {"dist": self.name, "mean_s": self.mean()}


@dataclass(frozen=True)
class Exponential(ThinkTime):
    mean_s: float
    name = "exponential"

    def cdf(self, t):
        return -math.expm1(-t / self.mean_s) if t > 0 else 0.0

    def mean_min(self, t):
        return self.mean_s * self.cdf(t)

    def quantile(self, u):
        return math.inf if u >= 1 else -self.mean_s * math.log1p(-u)


@dataclass(frozen=True)
class Deterministic(ThinkTime):
    """W = value_s always.  F is a step, so h jumps from 0 to h_max at N* = λ·value·(E[B] + A_H);
    a finite cache smooths that jump (fluctuations of the displacement), so near N* the
    simulated hit ratio sits in between (measured: 0.36 vs 0.5 at N = 1.05·N*)."""

    value_s: float
    name = "deterministic"

    def cdf(self, t):
        return 1.0 if t >= self.value_s else 0.0

    def mean_min(self, t):
        return min(t, self.value_s)

    def quantile(self, u):
        return self.value_s


@dataclass(frozen=True)
class LogNormal(ThinkTime):
    """Parametrised by its mean (not its median) so ``think_mean`` means the same for every law."""

    mean_s: float
    sigma: float
    name = "lognormal"

    @property
    def mu(self) -> float:
        return math.log(self.mean_s) - self.sigma**2 / 2

    def cdf(self, t):
        return _STD_NORMAL.cdf((math.log(t) - self.mu) / self.sigma) if t > 0 else 0.0

    def mean_min(self, t):
        if t <= 0:
            return 0.0
        if math.isinf(t):
            return self.mean_s
        # E[W; W <= t] + t·P(W > t); the partial mean of a log-normal is mean·Φ(z − σ)
        z = (math.log(t) - self.mu) / self.sigma
        return self.mean_s * _STD_NORMAL.cdf(z - self.sigma) + t * _STD_NORMAL.cdf(-z)

    def quantile(self, u):
        return math.inf if u >= 1 else math.exp(self.mu + self.sigma * _STD_NORMAL.inv_cdf(u))

    def describe(self):
        return {"dist": self.name, "mean_s": self.mean_s, "sigma": self.sigma}


@dataclass(frozen=True, eq=False)
class Empirical(ThinkTime):
    """The empirical CDF of observed gaps (a step function)."""

    samples: np.ndarray
    name = "empirical"
    _prefix: np.ndarray = field(init=False, repr=False)

    def __post_init__(self):
        w = np.sort(np.asarray(self.samples, dtype=np.float64))
        if w.size == 0 or not np.all(np.isfinite(w)) or w[0] < 0:
            raise InputError("gaps", "need at least one finite, non-negative gap")
        object.__setattr__(self, "samples", w)
        object.__setattr__(self, "_prefix", np.concatenate(([0.0], np.cumsum(w))))

    def cdf(self, t):
        return float(np.searchsorted(self.samples, t, side="right")) / self.samples.size

    def mean_min(self, t):
        n = self.samples.size
        below = int(np.searchsorted(self.samples, t, side="right"))
        return (self._prefix[below] + (t * (n - below) if below < n else 0.0)) / n

    def quantile(self, u):
        n = self.samples.size
        return float(self.samples[min(max(math.ceil(u * n - 1e-9), 1), n) - 1])

    def describe(self):
        w = self.samples
        return {"dist": self.name, "mean_s": float(w.mean()), "samples": int(w.size),
                "p50_s": float(np.percentile(w, 50)), "p90_s": float(np.percentile(w, 90)),
                "p99_s": float(np.percentile(w, 99))}


# ---------------------------------------------------------------- workload primitives


class Held(NamedTuple):
    """A model of several KV cache groups: what a session holds in the pool, in physical blocks (one group's page),
    where the primitives count a prompt's blocks once: E[B] and A_H with every group's blocks (``group_blocks``)."""

    last: float  # E[B]'s physical blocks
    history: float  # A_H's
    full_groups: int  # the groups holding every block (the practical variant's unhashable tail is one in each)


def group_blocks(blocks: float, groups: KvGroups, block_size: int) -> float:
    """Physical blocks the pool holds of a prompt of ``blocks`` whole blocks once its prefill is computed: every
    block in a full group, in a window group those its window has not passed (cache/groups.py ``skipped_blocks``,
    vLLM's remove_skipped_blocks: the rest are freed first and evicted before any other)."""
    if any(g.kind == STATE for g in groups.groups):
        raise InputError("--model", "state layers hold a state a session, not blocks a token: no block count")
    tokens = blocks * block_size
    return sum(blocks - max(0.0, tokens - g.window + 1) // block_size if g.kind == WINDOW else blocks
               for g in groups.groups)


@dataclass(frozen=True)
class Workload:
    """The primitives the estimate needs; λ is per second, not per block of capacity."""

    arrival_rate: float  # λ, sessions per second
    mean_blocks: float  # E[B] = E[R_M]
    history_blocks: float  # A_H
    prompt_blocks: float  # A_R
    mean_turns: float  # E[M]
    think: ThinkTime
    source: str = "model"
    held: Held | None = None  # KV cache groups: the blocks the pool holds, which the displacement counts

    def reusable(self, practical: bool) -> float:
        """A_H, or A_H^hash = A_H − E[M−1] (one unhashable tail block per non-final turn)."""
        return max(self.history_blocks - (self.mean_turns - 1.0), 0.0) if practical else self.history_blocks

    def inserted(self) -> float:
        """E[B] as the pool holds it (physical blocks with KV cache groups)."""
        return self.mean_blocks if self.held is None else self.held.last

    def moved(self, practical: bool) -> float:
        """The reusable history as the pool holds it: each full group's unhashable tails off in the practical variant."""
        held = self.held
        if held is None:
            return self.reusable(practical)
        return max(held.history - (held.full_groups * (self.mean_turns - 1.0) if practical else 0.0), 0.0)

    def h_max(self, practical: bool) -> float:
        return self.reusable(practical) / self.prompt_blocks

    def describe(self) -> dict:
        return {"arrival_rate": self.arrival_rate, "E_B": self.mean_blocks, "A_H": self.history_blocks,
                "A_H_hash": self.reusable(True), "A_R": self.prompt_blocks, "E_M": self.mean_turns,
                "think": self.think.describe(), "source": self.source}


def moments(turn_pmf: np.ndarray, mean_history: np.ndarray) -> tuple[float, float, float, float]:
    """(E[B], A_H, A_R, E[M]) from P(M = j) and R̄_j = E[R_j], j = 1..J.

    Increments are independent of M (the MCM's assumption), so A_R = Σ S_j R̄_j,
    A_H = Σ S_{j+1} R̄_j and E[B] = Σ P(M = j) R̄_j with S_j = P(M >= j).
    """
    pmf = np.asarray(turn_pmf, dtype=np.float64)
    r = np.asarray(mean_history, dtype=np.float64)
    survival = pmf[::-1].cumsum()[::-1]  # S_j
    s_next = np.append(survival[1:], 0.0)  # S_{j+1}
    e_m = float(np.dot(np.arange(1, pmf.size + 1), pmf))
    return float(np.dot(pmf, r)), float(np.dot(s_next, r)), float(np.dot(survival, r)), e_m


def geometric_pmf(continue_prob: float, max_turns: int) -> np.ndarray:
    """P(M = j) for min(Geometric(1 − p), max_turns), cut where S_j < 1e-17 (beyond float noise)."""
    p = continue_prob
    horizon = 1 if p == 0 else min(max_turns, int(math.ceil(math.log(1e-17) / math.log(p))) + 1)
    j = np.arange(1, horizon + 1, dtype=np.float64)
    pmf = (1.0 - p) * p ** (j - 1)
    pmf[-1] = p ** (horizon - 1)  # the capped (or negligible) tail lands on the last turn
    return pmf


# ---------------------------------------------------------------- the estimate


@dataclass(frozen=True)
class Estimate:
    variant: str  # "theoretical" | "practical"
    capacity_blocks: float
    hit_ratio: float
    h_max: float
    characteristic_time_s: float
    reusable_blocks: float  # A_H or A_H^hash, whichever the variant uses

    def to_dict(self) -> dict:
        return {"variant": self.variant, "capacity_blocks": self.capacity_blocks, "hit_ratio": self.hit_ratio,
                "h_max": self.h_max, "characteristic_time_s": self.characteristic_time_s,
                "reusable_blocks": self.reusable_blocks}


def displacement(w: Workload, capacity: float, t: float, practical: bool = False) -> float:
    """d(t): blocks moved ahead of a tagged session within t, per block of capacity."""
    return w.arrival_rate / capacity * (w.inserted() * t + w.moved(practical) * w.think.mean_min(t))


def characteristic_time(w: Workload, capacity: float, practical: bool = False) -> float:
    """T_C with d(T_C) = 1, by bisection: d is continuous, strictly increasing, d(0) = 0."""
    lam0 = w.arrival_rate / capacity
    a, b = w.moved(practical), w.inserted()
    if b <= 0:
        # only history moves blocks ahead, and at most A_H·E[W] of it: d may never reach 1
        if lam0 * a * w.think.mean() <= 1:
            return math.inf
        lo, hi = 0.0, 1.0
        while displacement(w, capacity, hi, practical) < 1:
            hi *= 2
    else:
        # E[min(W, t)] lies in [0, t], so d(t) is between λ0·E[B]·t and λ0·(E[B] + A)·t
        lo, hi = 1.0 / (lam0 * (b + a)), 1.0 / (lam0 * b)
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if displacement(w, capacity, mid, practical) < 1.0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-13 * hi:
            break
    return hi  # d(hi) >= 1: the first instant the tagged session is out


def estimate(w: Workload, capacity: float, practical: bool = False) -> Estimate:
    if not capacity > 0 or not math.isfinite(capacity):
        raise InputError("capacity_blocks", f"must be a positive number, got {capacity!r}")
    t_c = characteristic_time(w, capacity, practical)
    h_max = w.h_max(practical)
    hit = h_max * (1.0 if math.isinf(t_c) else w.think.cdf(t_c))
    return Estimate("practical" if practical else "theoretical", capacity, hit, h_max, t_c, w.reusable(practical))


def capacity_for(w: Workload, target: float, practical: bool = False) -> int:
    """Smallest whole number of blocks whose estimate reaches ``target``.

    d(T) = 1 is linear in N, so N = λ·(E[B]·T* + A·E[min(W, T*)]) at T* = F⁻¹(target / h_max).
    """
    h_max = w.h_max(practical)
    # A target equal to h_max up to rounding (416/520 is not exactly 0.8 in binary) is unreachable too.
    if not 0 < target < h_max * (1 - 1e-9):
        raise InputError("target_hit_ratio",
                         f"must be in (0, h_max) = (0, {h_max:.6g}); h_max = A_H/A_R is the most any "
                         f"capacity reaches (only history of continuing turns is reusable), got {target!r}")
    t_star = w.think.quantile(target / h_max)
    if not math.isfinite(t_star):
        raise InputError("target_hit_ratio", f"{target!r} is too close to h_max = {h_max:.6g} to reach")
    a = w.moved(practical)
    n = math.ceil(w.arrival_rate * (w.inserted() * t_star + a * w.think.mean_min(t_star)) - 1e-9)
    n = max(n, 1)
    # step CDFs (deterministic, empirical) sit exactly on a jump at T*: one more block clears it
    while estimate(w, n, practical).hit_ratio < target:
        n += 1
    return n


# ---------------------------------------------------------------- the scm model


THINK_DISTS = ("exponential", "deterministic", "lognormal")
TURN_DISTS = ("geometric", "fixed", "empirical")
_SCM = ScmPreset()


@dataclass(frozen=True)
class ScmModel:
    """The ``scm`` preset's parameters (same names, same defaults) plus laws it does not sample.

    ``think_dist``: exponential (the preset's), deterministic, or lognormal with log-space
    spread ``think_sigma``, all with mean ``think_mean``.  ``turn_dist``: geometric with
    ``continue_prob`` (the preset's, capped at ``max_turns``), ``fixed`` at ``turns``, or
    ``empirical`` with ``turn_pmf`` = weights of M = 1, 2, ... (normalised; counts work).
    """

    arrival_rate: float = _SCM.arrival_rate
    think_mean: float = _SCM.think_mean
    continue_prob: float = _SCM.continue_prob
    prompt_blocks: int = _SCM.prompt_blocks
    response_blocks: int = _SCM.response_blocks
    max_turns: int = _SCM.max_turns
    block_size: int = _SCM.block_size  # only for mirroring the preset: the model counts blocks
    block_tokens: int = _SCM.block_tokens  # the same
    think_dist: str = "exponential"
    think_sigma: float = 1.0
    turn_dist: str = "geometric"
    turns: int = 5
    turn_pmf: tuple[float, ...] = ()

    def __post_init__(self):
        _check_scm(self)

    def think(self) -> ThinkTime:
        if self.think_dist == "exponential":
            return Exponential(self.think_mean)
        if self.think_dist == "deterministic":
            return Deterministic(self.think_mean)
        return LogNormal(self.think_mean, self.think_sigma)

    def turn_probabilities(self) -> np.ndarray:
        if self.turn_dist == "geometric":
            return geometric_pmf(self.continue_prob, self.max_turns)
        if self.turn_dist == "fixed":
            pmf = np.zeros(self.turns)
            pmf[-1] = 1.0
            return pmf
        w = np.asarray(self.turn_pmf, dtype=np.float64)
        return w / w.sum()

    def workload(self, groups: KvGroups | None = None) -> Workload:
        """The primitives; ``groups``: a model of several KV cache groups, whose blocks the pool holds (``Held``)."""
        pmf = self.turn_probabilities()
        j = np.arange(1, pmf.size + 1, dtype=np.float64)
        # turn j's prompt: j prompts and the j−1 responses before it (the response of the
        # last turn never comes back as a prompt, so it is never a cache block)
        r_bar = j * self.prompt_blocks + (j - 1) * self.response_blocks
        e_b, a_h, a_r, e_m = moments(pmf, r_bar)
        held = None
        if groups is not None and groups.hybrid:
            physical = np.array([group_blocks(r, groups, self.block_size) for r in r_bar])
            b, h, _, _ = moments(pmf, physical)
            held = Held(b, h, _full_groups(groups))
        return Workload(self.arrival_rate, e_b, a_h, a_r, e_m, self.think(), "scm", held)


def _full_groups(groups: KvGroups) -> int:
    return sum(1 for g in groups.groups if g.kind == FULL)


def _check_scm(m: ScmModel) -> None:
    check_scm_conversations(m)
    require_int(m, "turns", 1)
    if m.think_dist not in THINK_DISTS:
        raise InputError("think_dist", f"must be one of {', '.join(THINK_DISTS)}, got {m.think_dist!r}")
    if m.think_dist == "lognormal":
        require_positive(m, "think_sigma")
    if m.turn_dist not in TURN_DISTS:
        raise InputError("turn_dist", f"must be one of {', '.join(TURN_DISTS)}, got {m.turn_dist!r}")
    if m.turn_dist == "empirical":
        w = m.turn_pmf
        if not w or any(not math.isfinite(x) or x < 0 for x in w) or sum(w) <= 0:
            raise InputError("turn_pmf", "must list non-negative weights of M = 1, 2, ... with a positive sum, "
                                         f"got {','.join(map(str, w)) or 'nothing'}")


# ---------------------------------------------------------------- primitives from a trace


def workload_from_trace(trace: Trace, physical: bool = False, groups: KvGroups | None = None) -> Workload:
    """Primitives measured on a trace, one session at a time (no independence assumed).

    R_j is the number of hashed blocks of turn j's prompt, which is what kvemu's block pool
    stores, or with ``physical`` the blocks an engine allocates, ceil(input_tokens /
    block_size), partial tail included (the paper's practical model).  λ counts session
    starts over the span between the first and the last; W is every gap between
    consecutive prompts of a session.  Sessions cut by the end of the trace count as shorter.
    ``groups``: a model of several KV cache groups, each prompt's blocks as the pool holds them too (``Held``).
    """
    sessions: dict[str, list] = {}
    for r in trace.requests:
        sessions.setdefault(r.session, []).append(r)
    bs = trace.block_size
    starts: list[float] = []
    gaps: list[float] = []
    sum_all, sum_hist, last, turns = 0.0, 0.0, 0.0, 0
    held_hist, held_last = 0.0, 0.0
    hybrid = groups is not None and groups.hybrid
    for reqs in sessions.values():
        reqs.sort(key=lambda r: (r.t, r.turn))
        sizes = [-(-r.input_tokens // bs) if physical else len(r.hash_ids) for r in reqs]
        starts.append(reqs[0].t)
        gaps.extend(b.t - a.t for a, b in zip(reqs, reqs[1:]))
        sum_all += sum(sizes)
        sum_hist += sum(sizes[:-1])
        last += sizes[-1]
        turns += len(reqs)
        if hybrid and groups is not None:
            held_hist += sum(group_blocks(x, groups, bs) for x in sizes[:-1])
            held_last += group_blocks(sizes[-1], groups, bs)
    n = len(sessions)
    span = max(starts) - min(starts)
    if n < 2 or span <= 0:
        raise InputError("trace", f"needs at least two sessions starting at different times, got {n}")
    if not gaps:
        raise InputError("trace", "has no multi-turn session, so no think-time distribution")
    if last <= 0:
        raise InputError("trace", "no session has a full block; nothing is ever cached")
    # (n − 1) / span is the unbiased rate estimate for n arrivals observed from first to last
    held = Held(held_last / n, held_hist / n, _full_groups(groups)) if hybrid and groups is not None else None
    return Workload((n - 1) / span, last / n, sum_hist / n, sum_all / n, turns / n, Empirical(np.asarray(gaps)),
                    trace.source or "trace", held)


def turn_counts(trace: Trace) -> np.ndarray:
    """Turns per session (for reporting the empirical turn-count law)."""
    counts: dict[str, int] = {}
    for r in trace.requests:
        counts[r.session] = counts.get(r.session, 0) + 1
    return np.fromiter(counts.values(), dtype=np.int64, count=len(counts))
