"""``freeinference``: heavy-tailed sessions matching the FreeInference production statistics
of When Fancy Eviction Fails (arXiv 2609.28870; docs/sources.md).

Targets (its "性质二/三/五"): intra-session gap median 8.2 s, p90 47 s, p99 409 s;
turns per multi-turn session median 5, p90 30, p99 168, max 412; session footprint (distinct
16-token blocks, i.e. the last turn's full blocks, over all sessions) median 45, p99 8.3K.
The source gives no footprint p90; we target 1.5K and add p99.9 = 12K because that pair makes
the top 10% / top 1% of sessions hold ≈76% / ≈21% of all footprint blocks, as it reports
(76.2% / 20.3%).

How: gaps, turns and footprints are drawn from piecewise power-law inverse CDFs through
those quantiles (exact by construction; past p99 the gap tail keeps its slope, which puts
99.7% of gaps under 22 minutes as in the source).  Turns and footprint are coupled by a
Gaussian copula (``size_turns_corr``): long sessions tend to be big without being forced to.
Each session takes the longest of ``system_candidates`` Zipf–Mandelbrot-popular system
prompts that fits in ``system_max_share`` of its footprint, so big sessions tend to carry big
prompts (coding agents) and small ones small prompts (chat UIs).  The rest of the footprint
is split over its prompts and responses by log-normal weights, the first prompt weighted up
(pasted code, documents), each message at least ``min_segment`` tokens; a footprint too small
for that is raised, which touches only rare many-turn/tiny sessions.

``single_frac`` of sessions are single-turn with the same footprint law.  Measured block
classes on 1-hour traces (shared = seen in more than one session), distinct / accessed:
system ≈2-4% / 11-16%, multi-turn history ≈28-41% / 73-81%, single-turn ≈55-70% / 8-14%
(seed: 4.7/18.4, 37.6/70.2, 57.8/11.4); system-prompt shares grow with duration.  Every
single-turn payload block is accessed once (seed: 84.9%): repeated identical prompts are not
modelled.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from loadgen.presets.common import (
    SessionBatch,
    lognormal,
    lognormal_int,
    make_batch,
    piecewise_pareto_quantile,
    poisson_starts,
    require_increasing,
    require_int,
    require_nonnegative,
    require_positive,
    require_probability,
    sample_catalog,
)
from shared.errors import InputError

FOOTPRINT_BLOCK = 16  # the source's footprint unit, independent of the trace's block_size


@dataclass(frozen=True)
class FreeInferencePreset:
    """Heavy-tailed production mix (When Fancy Eviction Fails): gap, turn and footprint quantiles of FreeInference."""

    session_rate: float = 0.25  # new sessions per second, single- and multi-turn
    single_frac: float = 0.6  # share of sessions with one turn
    gap_min: float = 0.5  # seconds
    gap_p50: float = 8.2
    gap_p90: float = 47.0
    gap_p99: float = 409.0
    gap_max: float = 14400.0
    turns_p50: float = 5.0  # multi-turn sessions only (>= 2 turns)
    turns_p90: float = 30.0
    turns_p99: float = 168.0
    turns_max: int = 412
    footprint_min: float = 2.0  # 16-token blocks
    footprint_p50: float = 45.0
    footprint_p90: float = 1500.0
    footprint_p99: float = 8300.0
    footprint_p999: float = 12000.0
    footprint_max: float = 160000.0  # ≈234 GiB at Qwen3-Coder's bytes/block, the source's largest
    size_turns_corr: float = 0.2
    first_prompt_weight: float = 4.0
    response_weight: float = 1.5
    segment_sigma: float = 1.0
    min_segment: int = 4  # tokens per prompt / response
    final_response_median: float = 200.0
    final_response_sigma: float = 0.8
    system_prompts: int = 3000  # catalog size; many apps, each with its own prompt
    system_prob: float = 0.9
    system_candidates: int = 8
    system_max_share: float = 0.6  # of the session's footprint
    system_median: float = 800.0
    system_sigma: float = 1.8  # heavy: chat UIs to coding agents
    zipf_s: float = 1.0
    zipf_q: float = 10.0
    block_size: int = 16

    def __post_init__(self):
        require_positive(self, "session_rate", "first_prompt_weight", "response_weight", "final_response_median",
                         "system_median", "zipf_s")
        require_probability(self, "single_frac", "system_prob", "system_max_share")
        require_increasing(self, "gap_min", "gap_p50", "gap_p90", "gap_p99", "gap_max")
        require_increasing(self, "turns_p50", "turns_p90", "turns_p99", "turns_max")
        require_increasing(self, "footprint_min", "footprint_p50", "footprint_p90", "footprint_p99",
                           "footprint_p999", "footprint_max")
        if self.turns_p50 <= 2:
            raise InputError("turns_p50", f"must be > 2 (multi-turn sessions have >= 2 turns), got {self.turns_p50}")
        if not -1 < self.size_turns_corr < 1:
            raise InputError("size_turns_corr", f"must be in (-1, 1), got {self.size_turns_corr}")
        require_nonnegative(self, "segment_sigma", "final_response_sigma", "system_sigma", "zipf_q")
        require_int(self, "turns_max", 3)
        require_int(self, "min_segment", 1)
        require_int(self, "system_prompts", 0)
        require_int(self, "system_candidates", 1)
        require_int(self, "block_size", 1)

    def plan(self, rng: np.random.Generator, duration_s: float) -> SessionBatch:
        starts = poisson_starts(rng, self.session_rate, duration_s)
        n = len(starts)
        z_size, z_noise = rng.standard_normal(n), rng.standard_normal(n)
        multi = rng.random(n) >= self.single_frac
        rho = self.size_turns_corr
        turns = np.where(multi, self._turns(_phi(rho * z_size + math.sqrt(1 - rho * rho) * z_noise)), 1)
        footprint = self._footprint_tokens(rng, _phi(z_size))
        catalog = sample_catalog(rng, "free", self.system_prompts, self.system_median, self.system_sigma,
                                 self.zipf_s, self.zipf_q)
        need = (2 * turns - 1) * self.min_segment
        sys_idx = self._pick_system(rng, catalog, footprint, need)
        sys_len = np.where(sys_idx >= 0, catalog.tokens[np.maximum(sys_idx, 0)] if len(catalog.tokens) else 0, 0)
        own = np.maximum(footprint - sys_len, need)
        prompt, output = self._split(rng, turns, own)
        gap = piecewise_pareto_quantile(rng.random(len(prompt)), [
            (0.0, self.gap_min), (0.5, self.gap_p50), (0.9, self.gap_p90), (0.99, self.gap_p99)], self.gap_max)
        kind = np.where(multi, "multi", "single")
        return make_batch(kind, starts, turns, sys_idx, prompt, output, gap, catalog)

    def _pick_system(self, rng, catalog, footprint: np.ndarray, need: np.ndarray) -> np.ndarray:
        """The longest of ``system_candidates`` popular prompts that fits, else none.

        Big sessions thereby tend to come from apps with big prompts (coding agents), small
        ones from apps with small prompts, while popularity stays Zipf–Mandelbrot.
        """
        n = len(footprint)
        if not catalog.labels or not n:
            return np.full(n, -1, dtype=np.int64)
        cand = catalog.pick(rng, n * self.system_candidates).reshape(n, self.system_candidates)
        length = catalog.tokens[cand]
        room = np.minimum(footprint * self.system_max_share, footprint - need)
        length = np.where(length <= room[:, None], length, -1)
        best = np.argmax(length, axis=1)
        chosen = cand[np.arange(n), best]
        ok = (length[np.arange(n), best] >= 0) & (rng.random(n) < self.system_prob)
        return np.where(ok, chosen, -1)

    def _turns(self, u: np.ndarray) -> np.ndarray:
        x = piecewise_pareto_quantile(u, [(0.0, 1.5), (0.5, self.turns_p50), (0.9, self.turns_p90),
                                          (0.99, self.turns_p99)], self.turns_max)
        return np.clip(np.rint(x), 2, self.turns_max).astype(np.int64)

    def _footprint_tokens(self, rng, u: np.ndarray) -> np.ndarray:
        blocks = np.rint(piecewise_pareto_quantile(u, [
            (0.0, self.footprint_min), (0.5, self.footprint_p50), (0.9, self.footprint_p90),
            (0.99, self.footprint_p99), (0.999, self.footprint_p999)], self.footprint_max)).astype(np.int64)
        # a random partial tail block, so the footprint in full 16-token blocks is exactly `blocks`
        return blocks * FOOTPRINT_BLOCK + rng.integers(0, FOOTPRINT_BLOCK, size=len(u))

    def _split(self, rng, turns: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Share each session's own tokens over prompt_0, response_0, ..., prompt_{M-1}."""
        n_seg = 2 * turns - 1
        seg_off = np.cumsum(n_seg) - n_seg
        seg_session = np.repeat(np.arange(len(turns)), n_seg)
        pos = np.arange(int(n_seg.sum())) - seg_off[seg_session]
        weight = lognormal(rng, 1.0, self.segment_sigma, len(pos))
        weight *= np.where(pos == 0, self.first_prompt_weight, 1.0) * np.where(pos % 2 == 1, self.response_weight, 1.0)
        total_w = np.bincount(seg_session, weights=weight, minlength=len(turns))
        spare = own - n_seg * self.min_segment
        tokens = self.min_segment + np.floor(spare[seg_session] * weight / total_w[seg_session]).astype(np.int64)
        # rounding leftovers go to the last prompt, so the footprint stays exact
        last = seg_off + n_seg - 1
        tokens[last] += own - np.bincount(seg_session, weights=tokens, minlength=len(turns)).astype(np.int64)
        turn_session = np.repeat(np.arange(len(turns)), turns)
        j = np.arange(int(turns.sum())) - (np.cumsum(turns) - turns)[turn_session]
        prompt = tokens[seg_off[turn_session] + 2 * j]
        is_last = j == turns[turn_session] - 1
        resp_idx = np.minimum(seg_off[turn_session] + 2 * j + 1, len(tokens) - 1)
        final = lognormal_int(rng, self.final_response_median, self.final_response_sigma, len(prompt), hi=1 << 17)
        output = np.where(is_last, final, tokens[resp_idx])
        return prompt, output


def _phi(z: np.ndarray) -> np.ndarray:
    """Standard normal CDF, kept away from 1 so quantile functions stay finite."""
    u = 0.5 * np.array([math.erfc(-v / math.sqrt(2.0)) for v in z.tolist()])
    return np.minimum(u, 1.0 - 1e-12)
