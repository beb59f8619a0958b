"""``scm``: the simple conversation model (SCM) of the mean-field LRU analysis of multi-turn
conversations (docs/sources.md).

Conversations arrive as a Poisson process (``arrival_rate`` per second).  The number of
turns M is geometric: P(M >= j+1 | M >= j) = ``continue_prob``, so E[M] = 1/(1-p).  Every
turn adds ``prompt_blocks`` full blocks of prompt; every turn but the last adds
``response_blocks`` of response to the next turn's history, so the input of 0-based turn j
is ``j*(prompt_blocks+response_blocks) + prompt_blocks`` blocks, all full (the paper's
theoretical model has no unhashable tail).  Think times are exponential with mean
``think_mean`` seconds.  There is no system prompt: conversations share nothing.

A block of the model is ``block_tokens`` tokens (16); ``block_size`` is only the unit the trace is
hashed in (``--block-size`` / ``--page-size`` set it), so the workload's tokens stay the same whatever
the matching mode cuts them into, as every preset's do (they moved with it before: pages of 1 made
every prompt 16x shorter). Give both to hash the model's blocks one to one at another size.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from loadgen.presets.common import (
    Catalog,
    SessionBatch,
    make_batch,
    poisson_starts,
    require_int,
    require_positive,
    require_probability,
)
from shared.errors import InputError

_NO_CATALOG = Catalog([], np.zeros(0, dtype=np.int64), np.zeros(0))


def check_scm_conversations(p) -> None:
    """The conversation fields the ``scm`` preset shares with the estimator's model (sim/estimate.py's
    ``ScmModel``): rates, the turn law and blocks per turn, each a one-line error naming the field."""
    require_positive(p, "arrival_rate", "think_mean")
    require_probability(p, "continue_prob")
    if p.continue_prob >= 1:
        raise InputError("continue_prob", "must be < 1 (conversations must end)")
    require_int(p, "prompt_blocks", 1)
    require_int(p, "response_blocks", 0)
    require_int(p, "max_turns", 1)
    require_int(p, "block_size", 1)


@dataclass(frozen=True)
class ScmPreset:
    """The mean-field paper's SCM: Poisson conversations, geometric turns, fixed blocks per turn, exponential think time."""

    arrival_rate: float = 0.3  # conversations per second (λ0); ≈1.5 requests/s at the default p
    think_mean: float = 135.0  # seconds; the paper's Experiment 2 value
    continue_prob: float = 0.8  # p; mean turns 1/(1-p) = 5
    prompt_blocks: int = 8  # k, full blocks of new prompt per turn
    response_blocks: int = 16  # m, full blocks of response per turn
    max_turns: int = 100_000  # only bites when p is within ~1e-4 of 1
    block_size: int = 16  # tokens a hashed block (the trace's unit)
    block_tokens: int = 16  # tokens a block of the model (what prompt_blocks and response_blocks count)

    def __post_init__(self):
        check_scm_conversations(self)
        require_int(self, "block_tokens", 1)

    def plan(self, rng: np.random.Generator, duration_s: float) -> SessionBatch:
        starts = poisson_starts(rng, self.arrival_rate, duration_s)
        n = len(starts)
        turns = np.minimum(rng.geometric(1.0 - self.continue_prob, size=n), self.max_turns).astype(np.int64)
        total = int(turns.sum())
        prompt = np.full(total, self.prompt_blocks * self.block_tokens, dtype=np.int64)
        output = np.full(total, self.response_blocks * self.block_tokens, dtype=np.int64)
        gap = rng.exponential(self.think_mean, size=total)
        return make_batch("multi", starts, turns, np.full(n, -1), prompt, output, gap, _NO_CATALOG)
