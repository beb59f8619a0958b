"""Speculative decoding as vLLM's scheduler runs it (``--speculative-method``, ``--num-speculative-tokens``).

A decoding request holds ``K`` draft tokens proposed after its last step (n-gram lookup, an EAGLE head, or
the model's MTP layer); a step schedules its sampled token and its drafts, ``1 + K`` query tokens (vLLM:
``num_tokens_with_spec - num_computed_tokens``), with KV slots for all of them, and counts them against the
token budget. The verify forward accepts a leading run of ``a`` drafts (``0 <= a <= K``) and samples one more
token: the request keeps ``a + 1`` tokens (cut at its ``max_tokens``, as vLLM trims a stopped request's
output). Rejected drafts' KV is not kept: vLLM rolls ``num_computed_tokens`` back by ``K - a``; the blocks it
allocated for their slots stay in the request's block table, reused by the next step's slots, and go back
only when the request finishes or is preempted (``allocate_slots`` never shrinks a table). Only full blocks
of kept tokens are hashed (vLLM caches up to ``request.num_tokens``, which drafts are not part of).

Slots a step needs (vLLM ``allocate_slots``): computed + scheduled + ``lookahead`` tokens, at most
``max_model_len``; ``lookahead`` is vLLM's ``num_lookahead_tokens``: 0 for n-gram, ``K`` for the methods that
run a draft model on the target's hidden states (eagle, mtp: their draft KV is written ahead), at admission
too. A request's drafts are cut to ``max_model_len - num_tokens`` (vLLM's n-gram proposer).

The acceptance model decides ``a``: a per-position rate ``p`` (position ``i`` accepted with ``p`` given
``i - 1`` was: ``P(a >= i) = p^i``), or a measured distribution of accepted lengths ``0..K``. Each draw is a
function of (seed, request id, the request's verify count) through xxhash, so a run is deterministic
whatever order requests are verified in, and the live replica and the simulator draw the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import xxhash

from shared.errors import InputError

METHODS = ("ngram", "eagle", "mtp")
# vLLM's num_lookahead_tokens: the draft model's own KV slots beyond the verified tokens (config/vllm.py)
_LOOKAHEAD = {"ngram": False, "eagle": True, "mtp": True}
_LENGTH_SUM_TOLERANCE = 1e-3


class Acceptance(Protocol):
    """How many of ``drafts`` draft tokens request ``rid``'s ``step``-th verification accepts."""

    def accepted(self, rid: int, step: int, drafts: int) -> int: ...


def _uniform(seed: int, rid: int, step: int) -> float:
    """A uniform number in (0, 1], a fixed function of its arguments."""
    h = xxhash.xxh3_64_intdigest(f"{seed}:{rid}:{step}".encode())
    return (h + 1) / 2.0**64


@dataclass(frozen=True, slots=True)
class RateAcceptance:
    """Per-position acceptance: ``P(a >= i) = rate^i``, so ``a = floor(ln u / ln rate)`` for one uniform ``u``."""

    rate: float
    seed: int = 0

    def accepted(self, rid: int, step: int, drafts: int) -> int:
        if self.rate >= 1.0:
            return drafts
        u = _uniform(self.seed, rid, step)
        return min(drafts, int(math.log(u) / math.log(self.rate)))


@dataclass(frozen=True, slots=True)
class LengthAcceptance:
    """A measured distribution: ``probs[a]`` is the share of verifications that accept ``a`` drafts."""

    probs: tuple[float, ...]
    seed: int = 0

    def accepted(self, rid: int, step: int, drafts: int) -> int:
        u = _uniform(self.seed, rid, step) * sum(self.probs)
        acc = 0.0
        for a, q in enumerate(self.probs):
            acc += q
            if u <= acc:
                return min(drafts, a)
        return min(drafts, len(self.probs) - 1)


@dataclass(frozen=True, slots=True)
class ForcedAcceptance:
    """Given acceptances (a test's, or the golden files' shared with vLLM's driver): request ``rid``'s
    ``step``-th verification accepts ``lists[rid][step]`` (0 past its list's end), at most ``drafts``."""

    lists: dict[int, Sequence[int]]

    def accepted(self, rid: int, step: int, drafts: int) -> int:
        seq = self.lists.get(rid, ())
        return min(drafts, seq[step]) if step < len(seq) else 0


@dataclass(frozen=True, slots=True)
class SpecDecode:
    """The speculative decoding a scheduler runs: ``method``, ``num_tokens`` (K) and one acceptance model,
    ``acceptance_rate`` or ``acceptance_lengths`` (probabilities of 0..K accepted drafts), drawn with ``seed``."""

    method: str
    num_tokens: int
    acceptance_rate: float = 0.0  # 0: acceptance_lengths gives the distribution
    acceptance_lengths: tuple[float, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        check_spec(self.method, self.num_tokens, self.acceptance_rate, self.acceptance_lengths)

    @property
    def lookahead(self) -> int:
        """vLLM's ``num_lookahead_tokens``: KV slots a draft model writes beyond the scheduled tokens."""
        return self.num_tokens if _LOOKAHEAD[self.method] else 0

    def model(self) -> Acceptance:
        if self.acceptance_lengths:
            return LengthAcceptance(self.acceptance_lengths, self.seed)
        return RateAcceptance(self.acceptance_rate, self.seed)


def check_spec(method: str, k: int, rate: float, lengths: Sequence[float], flags: bool = False) -> None:
    """One line for each bad value, naming the flag (``flags``) or the field."""
    def name(field: str, flag: str) -> str:
        return flag if flags else field
    if method not in METHODS:
        raise InputError(name("method", "--speculative-method"), f"must be one of {', '.join(METHODS)}, got {method!r}")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise InputError(name("num_tokens", "--num-speculative-tokens"), f"must be an integer >= 1, got {k!r}")
    if bool(rate) == bool(lengths):
        raise InputError(name("acceptance_rate", "--acceptance-rate"),
                         "give one acceptance model: --acceptance-rate P or --acceptance-lengths FILE|a,b,c")
    if rate and not 0.0 < rate <= 1.0:
        raise InputError(name("acceptance_rate", "--acceptance-rate"), f"must be in (0, 1], got {rate!r}")
    if lengths:
        field = name("acceptance_lengths", "--acceptance-lengths")
        if len(lengths) > k + 1:
            raise InputError(field, f"gives {len(lengths)} lengths (0..{len(lengths) - 1} accepted) but at most"
                                    f" {k} drafts can be accepted (--num-speculative-tokens {k}): give at most {k + 1}")
        if any(not 0.0 <= q <= 1.0 for q in lengths):
            raise InputError(field, f"are probabilities in [0, 1], got {list(lengths)}")
        if abs(sum(lengths) - 1.0) > _LENGTH_SUM_TOLERANCE:
            raise InputError(field, f"must sum to 1 (the share of steps accepting 0, 1, ... drafts), they sum to"
                                    f" {sum(lengths):g}")


def parse_lengths(text: str, field: str = "--acceptance-lengths") -> tuple[float, ...]:
    """``a,b,c`` or a file holding such numbers (commas, spaces or lines between them)."""
    path = Path(text)
    if not text.replace(",", "").replace(".", "").replace(" ", "").isdigit() and path.is_file():
        text = path.read_text()
    elif "," not in text and not text.strip().replace(".", "").isdigit():
        raise InputError(field, f"{text!r} is neither a file nor a comma list of probabilities (e.g. 0.2,0.3,0.5)")
    parts = [x for x in text.replace(",", " ").split() if x]
    try:
        return tuple(float(x) for x in parts)
    except ValueError:
        raise InputError(field, f"must be numbers (the share of steps accepting 0, 1, ... drafts), got {text.strip()!r}") \
            from None
