"""Summary statistics of a trace: volume, block reuse under an infinite cache, session shape."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from loadgen.trace import Trace


@dataclass(slots=True)
class Distribution:
    count: int
    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None

    @classmethod
    def of(cls, values) -> Distribution:
        arr = np.asarray(values, dtype=float)
        if arr.size == 0:
            return cls(0, None, None, None, None, None)
        p50, p90, p99 = np.percentile(arr, [50, 90, 99])  # linear interpolation between ranks
        return cls(int(arr.size), float(arr.mean()), float(p50), float(p90), float(p99), float(arr.max()))

    def to_dict(self) -> dict:
        return {"count": self.count, "mean": self.mean, "p50": self.p50, "p90": self.p90, "p99": self.p99, "max": self.max}


@dataclass(slots=True)
class KindStats:
    requests: int = 0
    sessions: int = 0
    block_accesses: int = 0
    input_tokens: int = 0

    def to_dict(self) -> dict:
        return {"requests": self.requests, "sessions": self.sessions, "block_accesses": self.block_accesses,
                "input_tokens": self.input_tokens}


@dataclass(slots=True)
class TraceStats:
    source: str
    block_size: int
    requests: int
    sessions: int
    single_turn_sessions: int
    duration_s: float
    block_accesses: int  # sum of len(hash_ids)
    distinct_blocks: int
    # Fraction of block accesses that touch a block seen before: the block hit ratio of a
    # cache that never evicts, i.e. the ceiling any eviction policy can reach.
    infinite_cache_block_hit: float
    input_tokens: int
    output_tokens: int
    turns_per_session: Distribution
    intra_session_gap_s: Distribution
    session_footprint_blocks: Distribution
    input_tokens_per_request: Distribution
    output_tokens_per_request: Distribution
    kinds: dict[str, KindStats] = field(default_factory=dict)  # empty when the trace has no `kind`

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):
            name, value = f.name, getattr(self, f.name)
            if isinstance(value, Distribution):
                value = value.to_dict()
            elif name == "kinds":
                value = {k: v.to_dict() for k, v in value.items()}
            out[name] = value
        return out


def _session_shapes(trace: Trace) -> tuple[list[int], list[float], list[int]]:
    """Per session: request count and distinct-block footprint; and every intra-session gap."""
    times: dict[str, list[float]] = {}
    blocks: dict[str, set[int]] = {}
    for r in trace.requests:
        times.setdefault(r.session, []).append(r.t)
        blocks.setdefault(r.session, set()).update(r.hash_ids)
    gaps: list[float] = []
    for ts in times.values():
        if len(ts) > 1:
            ts.sort()
            gaps.extend(b - a for a, b in zip(ts, ts[1:]))
    return [len(ts) for ts in times.values()], gaps, [len(s) for s in blocks.values()]


def _kinds(trace: Trace) -> dict[str, KindStats]:
    kinds: dict[str, KindStats] = {}
    sessions: dict[str, set[str]] = {}
    for r in trace.requests:
        if r.kind is None:
            continue
        ks = kinds.setdefault(r.kind, KindStats())
        ks.requests += 1
        ks.block_accesses += len(r.hash_ids)
        ks.input_tokens += r.input_tokens
        sessions.setdefault(r.kind, set()).add(r.session)
    for kind, ks in kinds.items():
        ks.sessions = len(sessions[kind])
    return dict(sorted(kinds.items()))


def trace_stats(trace: Trace) -> TraceStats:
    reqs = trace.requests
    seen: set[int] = set()
    accesses = 0
    for r in reqs:
        accesses += len(r.hash_ids)
        seen.update(r.hash_ids)
    turns, gaps, footprints = _session_shapes(trace)
    ts = [r.t for r in reqs]
    n_in = [r.input_tokens for r in reqs]
    n_out = [r.output_tokens for r in reqs]
    return TraceStats(
        source=trace.source,
        block_size=trace.block_size,
        requests=len(reqs),
        sessions=len(turns),
        single_turn_sessions=sum(1 for n in turns if n == 1),
        duration_s=(max(ts) - min(ts)) if ts else 0.0,
        block_accesses=accesses,
        distinct_blocks=len(seen),
        infinite_cache_block_hit=(1.0 - len(seen) / accesses) if accesses else 0.0,
        input_tokens=sum(n_in),
        output_tokens=sum(n_out),
        turns_per_session=Distribution.of(turns),
        intra_session_gap_s=Distribution.of(gaps),
        session_footprint_blocks=Distribution.of(footprints),
        input_tokens_per_request=Distribution.of(n_in),
        output_tokens_per_request=Distribution.of(n_out),
        kinds=_kinds(trace),
    )


@dataclass(frozen=True, slots=True)
class ConversationShape:
    """What FlashGen (Jeong and Ahn, ASPLOS 2025) reports of ShareGPT, measured on a trace: turns per
    session (median 3, mean 7 there) and how much longer a prompt with its history is than the
    turn's own new tokens (99x there, "history is more than half of every prompt even at the
    median"). A turn's new tokens are its prompt less the previous turn's prompt and response; turn
    0's are its whole prompt (a system prompt counts as new: ShareGPT has none)."""

    sessions: int
    turns_median: float | None
    turns_mean: float | None
    prompt_over_new_mean: float | None  # mean over requests of prompt tokens / new tokens
    prompt_over_new_median: float | None
    history_share_median: float | None  # median over requests of history tokens / prompt tokens

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def conversation_shape(trace: Trace) -> ConversationShape:
    by_session: dict[str, list] = {}
    for r in trace.requests:
        by_session.setdefault(r.session, []).append(r)
    ratios: list[float] = []
    shares: list[float] = []
    for turns in by_session.values():
        turns.sort(key=lambda r: r.turn)
        before = 0  # the previous turn's prompt and response: this turn's history
        for r in turns:
            history = min(before, r.input_tokens) if r.turn else 0
            new = max(r.input_tokens - history, 1)
            ratios.append(r.input_tokens / new)
            shares.append(history / r.input_tokens if r.input_tokens else 0.0)
            before = r.input_tokens + r.output_tokens
    counts = Distribution.of([len(t) for t in by_session.values()])
    amplification, share = Distribution.of(ratios), Distribution.of(shares)
    return ConversationShape(len(by_session), counts.p50, counts.mean, amplification.mean, amplification.p50,
                             share.p50)
