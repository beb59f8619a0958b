"""The session profiles of WAKMan (Workload Aware KVCache Manager) and the presets built on them: ``chat``, ``agent``,
``single`` and their ``mix``.

Every length is log-normal (median, log-space sigma); popular system prompts come from a
per-profile catalog with Zipf–Mandelbrot popularity.  Turn counts of ``chat`` / ``agent`` are
a rounded log-normal given by its median and mean (ShareGPT: median 3, mean 7, as FlashGen (Jeong and Ahn, ASPLOS 2025) reports).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from loadgen.presets.common import (
    SessionBatch,
    lognormal,
    lognormal_int,
    make_batch,
    poisson_starts,
    require_int,
    require_nonnegative,
    require_positive,
    require_probability,
    rounded_lognormal_mean,
    rounded_lognormal_sigma,
    sample_catalog,
    sample_turns,
    truncate_context,
)
from loadgen.presets.fanout import check_fanout, with_fanouts
from shared.errors import InputError

_MAX_MESSAGE = 1 << 17  # one message never exceeds a 128K-token window
# Solving for the turn-count spread sums the distribution up to max_turns; this bound keeps
# that instant (and no conversation has more turns).
MAX_TURNS_CAP = 10_000


def _check_catalog(p) -> None:
    require_int(p, "system_prompts", 0)
    require_positive(p, "system_median", "zipf_s")
    require_nonnegative(p, "system_sigma", "zipf_q")


def _check_multi_turn(p, *messages: str) -> None:
    """A chat or agent profile: its turns, gaps, catalog and the lengths of its ``messages`` (each a
    ``NAME_median`` and ``NAME_sigma``) and responses; a turn-count median and mean no spread can give
    fail here, not when sampling."""
    require_positive(p, "turns_median", "turns_mean", "gap_median", *(f"{m}_median" for m in messages),
                     "response_median")
    require_nonnegative(p, "gap_sigma", *(f"{m}_sigma" for m in messages), "response_sigma")
    require_int(p, "max_turns", 1, MAX_TURNS_CAP)
    require_int(p, "max_context", 1)
    _check_catalog(p)
    rounded_lognormal_sigma(float(p.turns_median), float(p.turns_mean), p.max_turns)


@dataclass(frozen=True)
class ChatProfile:
    """Human multi-turn chat (ShareGPT-like): median 3 turns, mean 7, gaps of tens of seconds."""

    turns_median: float = 3.0
    turns_mean: float = 7.0
    max_turns: int = 500
    gap_median: float = 30.0  # seconds between turn arrivals
    gap_sigma: float = 1.0
    prompt_median: float = 80.0  # new user tokens per turn
    prompt_sigma: float = 1.0
    response_median: float = 250.0
    response_sigma: float = 0.8
    system_prompts: int = 20  # catalog size; 0 = no system prompt
    system_median: float = 300.0
    system_sigma: float = 0.5
    zipf_s: float = 1.0
    zipf_q: float = 2.7
    max_context: int = 131072  # a session ends at the turn that would exceed it

    def __post_init__(self):
        _check_multi_turn(self, "prompt")

    def mean_turns(self) -> float:
        sigma = rounded_lognormal_sigma(float(self.turns_median), float(self.turns_mean), self.max_turns)
        return rounded_lognormal_mean(self.turns_median, sigma, self.max_turns)

    def sample(self, rng: np.random.Generator, starts: np.ndarray) -> SessionBatch:
        return _sample_multi(rng, starts, "multi", self, self.prompt_median, self.prompt_sigma,
                             self.prompt_median, self.prompt_sigma)


@dataclass(frozen=True)
class AgentProfile:
    """Agentic sessions: many turns seconds apart, context grows by tool outputs."""

    turns_median: float = 15.0
    turns_mean: float = 25.0
    max_turns: int = 400
    gap_median: float = 3.0
    gap_sigma: float = 0.8
    task_median: float = 300.0  # the user's task, turn 0
    task_sigma: float = 1.0
    tool_median: float = 400.0  # tool output that opens every later turn
    tool_sigma: float = 1.2
    response_median: float = 150.0  # tool call / reasoning
    response_sigma: float = 0.8
    system_prompts: int = 8  # agent frameworks: few, long prompts (tool schemas)
    system_median: float = 3000.0
    system_sigma: float = 0.4
    zipf_s: float = 1.0
    zipf_q: float = 1.0
    max_context: int = 131072
    # Fan-outs (loadgen/presets/fanout.py; docs/agentic.md gives each default's source). Parallel tool calls: a turn
    # issues tool_calls_mean calls (2 + Poisson) with this chance, so a turn averages 1 + 0.1 x 2 = 1.2 tool calls,
    # TraceLab's 432,510 calls over 357,161 agent steps (1.21); 3 calls a fan-out is a chosen default.
    tool_fanout_prob: float = 0.1
    tool_calls_mean: float = 3.0
    # Subagents: a turn spawns subagents_mean of them (1 + Poisson) with this chance, so a session of the mean 25
    # turns spawns 24 x 0.037 x 2 = 1.78, the 156 subagent sessions over 88 Claude Code threads (1.77) of the one
    # published count; 2 a spawn and their turns (median 5, mean 8) are chosen defaults.
    subagent_prob: float = 0.037
    subagents_mean: float = 2.0
    subagent_turns_median: float = 5.0
    subagent_turns_mean: float = 8.0

    def __post_init__(self):
        _check_multi_turn(self, "task", "tool")
        check_fanout(self)

    mean_turns = ChatProfile.mean_turns

    def sample(self, rng: np.random.Generator, starts: np.ndarray) -> SessionBatch:
        batch = _sample_multi(rng, starts, "agent", self, self.task_median, self.task_sigma,
                              self.tool_median, self.tool_sigma)
        return with_fanouts(rng, batch, self)


@dataclass(frozen=True)
class SingleProfile:
    """One-turn requests: a popular system prompt (Zipf–Mandelbrot catalog) + a unique payload."""

    system_prompts: int = 200
    system_median: float = 1000.0
    system_sigma: float = 0.6
    zipf_s: float = 1.1
    zipf_q: float = 2.7
    payload_median: float = 200.0
    payload_sigma: float = 1.0
    response_median: float = 150.0
    response_sigma: float = 0.8

    def __post_init__(self):
        _check_catalog(self)
        require_positive(self, "payload_median", "response_median")
        require_nonnegative(self, "payload_sigma", "response_sigma")

    def mean_turns(self) -> float:
        return 1.0

    def sample(self, rng: np.random.Generator, starts: np.ndarray) -> SessionBatch:
        n = len(starts)
        catalog = sample_catalog(rng, "single", self.system_prompts, self.system_median, self.system_sigma,
                                 self.zipf_s, self.zipf_q)
        return make_batch("single", starts, np.ones(n, dtype=np.int64), catalog.pick(rng, n),
                          lognormal_int(rng, self.payload_median, self.payload_sigma, n, hi=_MAX_MESSAGE),
                          lognormal_int(rng, self.response_median, self.response_sigma, n, hi=_MAX_MESSAGE),
                          np.zeros(n), catalog)


def _sample_multi(rng, starts, kind: str, p, first_median, first_sigma, next_median, next_sigma) -> SessionBatch:
    n = len(starts)
    catalog = sample_catalog(rng, kind, p.system_prompts, p.system_median, p.system_sigma, p.zipf_s, p.zipf_q)
    sys_idx = catalog.pick(rng, n)
    turns = sample_turns(rng, p.turns_median, p.turns_mean, p.max_turns, n)
    total = int(turns.sum())
    is_first = np.zeros(total, dtype=bool)
    is_first[np.cumsum(turns) - turns] = True
    prompt = np.where(is_first,
                      lognormal_int(rng, first_median, first_sigma, total, hi=_MAX_MESSAGE),
                      lognormal_int(rng, next_median, next_sigma, total, hi=_MAX_MESSAGE))
    output = lognormal_int(rng, p.response_median, p.response_sigma, total, hi=_MAX_MESSAGE)
    gap = lognormal(rng, p.gap_median, p.gap_sigma, total)
    batch = make_batch(kind, starts, turns, sys_idx, prompt, output, gap, catalog)
    return truncate_context(batch, p.max_context)


def _check_rate(p, name: str) -> None:
    require_positive(p, name)
    require_int(p, "block_size", 1)


class _PoissonStarts:
    """What makes a profile a preset: its sessions start as a Poisson process at the rate in the field
    named ``RATE`` (the preset's dataclass adds that field and ``block_size``)."""

    RATE: ClassVar[str]
    sample: Callable[[np.random.Generator, np.ndarray], SessionBatch]  # the profile's

    def __post_init__(self):
        super().__post_init__()  # the profile's checks
        _check_rate(self, self.RATE)

    def plan(self, rng: np.random.Generator, duration_s: float) -> SessionBatch:
        return self.sample(rng, poisson_starts(rng, getattr(self, self.RATE), duration_s))


@dataclass(frozen=True)
class ChatPreset(_PoissonStarts, ChatProfile):
    __doc__ = ChatProfile.__doc__
    RATE = "session_rate"
    session_rate: float = 0.2  # new sessions per second (≈1.4 requests/s)
    block_size: int = 16


@dataclass(frozen=True)
class AgentPreset(_PoissonStarts, AgentProfile):
    __doc__ = AgentProfile.__doc__
    RATE = "session_rate"
    session_rate: float = 0.05  # ≈1.25 requests/s
    block_size: int = 16


@dataclass(frozen=True)
class SinglePreset(_PoissonStarts, SingleProfile):
    __doc__ = SingleProfile.__doc__
    RATE = "request_rate"
    request_rate: float = 1.5
    block_size: int = 16


_MIX_KINDS = ("single", "multi", "agent")


@dataclass(frozen=True)
class MixPreset:
    """WAKMan's mix: each new session is single / multi / agent with the given fractions.

    Profile parameters are set as ``single.NAME``, ``multi.NAME`` (a chat profile) and
    ``agent.NAME``.  ``request_rate`` is the long-run mean over all kinds.
    """

    request_rate: float = 1.5
    single_frac: float = 1 / 3
    multi_frac: float = 1 / 3
    agent_frac: float = 1 / 3
    block_size: int = 16
    single: SingleProfile = field(default_factory=SingleProfile)
    multi: ChatProfile = field(default_factory=ChatProfile)
    # WAKMan's agent sessions take turns one after another: no fan-out unless agent.tool_fanout_prob or
    # agent.subagent_prob is set
    agent: AgentProfile = field(default_factory=lambda: AgentProfile(tool_fanout_prob=0.0, subagent_prob=0.0))

    def __post_init__(self):
        _check_rate(self, "request_rate")
        require_probability(self, "single_frac", "multi_frac", "agent_frac")
        total = self.single_frac + self.multi_frac + self.agent_frac
        if abs(total - 1.0) > 1e-6:
            raise InputError("single_frac+multi_frac+agent_frac", f"fractions must sum to 1, got {total:.6g}")
        for name, typ in (("single", SingleProfile), ("multi", ChatProfile), ("agent", AgentProfile)):
            if not isinstance(getattr(self, name), typ):
                raise InputError(name, f"set its parameters as {name}.NAME=VALUE")

    def fractions(self) -> np.ndarray:
        f = np.array([self.single_frac, self.multi_frac, self.agent_frac], dtype=np.float64)
        return f / f.sum()

    def plan(self, rng: np.random.Generator, duration_s: float) -> SessionBatch:
        fracs = self.fractions()
        profiles: tuple[Any, ...] = (self.single, self.multi, self.agent)  # each has mean_turns() and sample()
        turns_per_session = sum(f * p.mean_turns() for f, p in zip(fracs, profiles))
        starts = poisson_starts(rng, self.request_rate / turns_per_session, duration_s)
        kinds = rng.choice(len(_MIX_KINDS), size=len(starts), p=fracs)
        return SessionBatch.concat([p.sample(rng, starts[kinds == k]) for k, p in enumerate(profiles)])
