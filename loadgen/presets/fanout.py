"""An agent's fan-outs (issue 55): a turn whose answer issues parallel tool calls or spawns subagents.

* **Parallel tool calls**: the turn's answer names several tools; each child is one short request on the parent's
  context (its prompt and answer, then the tool's result) that runs at once with its siblings.
* **Subagents**: each child is a chain of turns of its own, its first on the parent's context plus a task, its
  later ones each after the one before plus a tool's time; siblings run at once. A subagent spawns none itself
  (Claude Code's subagents cannot).

Every child waits for the parent's turn (``after``); the parent's next turn, the join, waits for every child's last
turn plus its own gap, and its prompt carries the children's results (each child's last answer), so the parent's
context grows by them. Children keep the parent's session, so session affinity and cache-aware routing see one
agent; their blocks start with the parent's (the full blocks of its prompt and answer), then go their own way.

Recorded times (``t``) take no service time, as the presets always have: a child arrives its gap after the parent
turn arrived, the join its gap after the last child's last turn. Dependent arrivals (``after``, ``gap_s``) add the
cluster's service times to that. The draws come after every draw of the sessions themselves, so a profile with no
fan-out gives the trace it gave before, and a session with none has no ``after``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from loadgen.presets.common import (
    SessionBatch,
    _session_chain,
    lognormal,
    lognormal_int,
    require_positive,
    require_probability,
    rounded_lognormal_sigma,
    sample_turns,
    truncate_context,
)
from loadgen.trace import TraceRequest
from shared.errors import InputError

TOOLS, SUBAGENTS = "tools", "subagents"


class Child(NamedTuple):
    """One child of a fan-out, turn by turn: its new prompt tokens, its answer's, and its gap (seconds after what
    it waits for: the parent's turn for its first, its turn before for the others)."""

    prompt: tuple[int, ...]
    output: tuple[int, ...]
    gap: tuple[float, ...]


class FanOut(NamedTuple):
    turn: int  # the parent's turn (0-based in its session) whose answer fans out; turn + 1 joins
    kind: str  # TOOLS or SUBAGENTS
    children: tuple[Child, ...]

    def results(self) -> int:
        """The tokens the join's prompt carries: each child's last answer."""
        return sum(c.output[-1] for c in self.children)


def check_fanout(p) -> None:
    """An agent profile's fan-out parameters (``tool_fanout_prob`` ...)."""
    require_probability(p, "tool_fanout_prob", "subagent_prob")
    if p.tool_fanout_prob + p.subagent_prob > 1:
        raise InputError("tool_fanout_prob+subagent_prob", "a turn fans out one way at most: their sum must be <= 1,"
                                                           f" got {p.tool_fanout_prob + p.subagent_prob:.6g}")
    require_positive(p, "subagent_turns_median", "subagent_turns_mean")
    if not p.tool_calls_mean >= 2:
        raise InputError("tool_calls_mean", f"a parallel tool-call turn issues 2 calls or more: must be >= 2, got"
                                            f" {p.tool_calls_mean}")
    if not p.subagents_mean >= 1:
        raise InputError("subagents_mean", f"a spawning turn starts 1 subagent or more: must be >= 1, got"
                                           f" {p.subagents_mean}")
    rounded_lognormal_sigma(float(p.subagent_turns_median), float(p.subagent_turns_mean), p.max_turns,
                            "subagent_turns_mean")


def with_fanouts(rng: np.random.Generator, batch: SessionBatch, p) -> SessionBatch:
    """``batch`` (an agent profile's sessions, cut at the context window) with fan-outs drawn for it: the joins'
    prompts grown by the children's results, the sessions cut at the window again, children cut at it too."""
    if p.tool_fanout_prob == 0 and p.subagent_prob == 0:
        return batch
    drawn = _draw(rng, batch, p)
    prompt = batch.prompt.copy()
    sys_len = batch.sys_len()
    offsets = batch.offsets()
    fanouts: dict[int, tuple[FanOut, ...]] = {}
    for s, fans in drawn.items():
        first, kept = int(offsets[s]), []
        for f in fans:  # in turn order: the context each fan-out sees holds the earlier ones' results
            j = first + f.turn
            shared = int(sys_len[s] + prompt[first:j + 1].sum() + batch.output[first:j + 1].sum())
            f = f._replace(children=tuple(_cut(c, shared, p.max_context) for c in f.children))
            prompt[j + 1] += f.results()
            kept.append(f)
        fanouts[s] = tuple(kept)
    grown = SessionBatch(batch.kind, batch.start, batch.turns, batch.sys_idx, prompt, batch.output, batch.gap,
                         batch.sys_tokens, batch.sys_labels, fanouts)
    return truncate_context(grown, p.max_context)


def _cut(child: Child, shared: int, max_context: int) -> Child:
    """``child`` without the turns whose prompt would pass the context window (its first is always kept)."""
    inputs = shared + np.cumsum(child.prompt) + np.concatenate(([0], np.cumsum(child.output)[:-1]))
    n = max(1, int(np.searchsorted(inputs, max_context, side="right")))
    return Child(child.prompt[:n], child.output[:n], child.gap[:n])


def _draw(rng: np.random.Generator, batch: SessionBatch, p) -> dict[int, list[FanOut]]:
    """Per agent session, its fan-outs in turn order: each turn with a next one fans out to subagents with
    ``subagent_prob``, else to parallel tool calls with ``tool_fanout_prob``."""
    sessions = np.flatnonzero((batch.kind == "agent") & (batch.turns > 1))
    parents = [(int(s), j) for s in sessions for j in range(int(batch.turns[s]) - 1)]
    u = rng.random(len(parents))
    spawn = u < p.subagent_prob
    tools = ~spawn & (u < p.subagent_prob + p.tool_fanout_prob)
    n_tools = 2 + rng.poisson(p.tool_calls_mean - 2, int(tools.sum()))
    n_subs = 1 + rng.poisson(p.subagents_mean - 1, int(spawn.sum()))
    tool_children = _tool_calls(rng, int(n_tools.sum()), p)
    sub_children = _subagents(rng, int(n_subs.sum()), p)
    out: dict[int, list[FanOut]] = {}
    it_tools, it_subs = iter(n_tools.tolist()), iter(n_subs.tolist())
    for (s, j), is_spawn, is_tools in zip(parents, spawn.tolist(), tools.tolist()):
        if is_spawn:
            n = next(it_subs)
            out.setdefault(s, []).append(FanOut(j, SUBAGENTS, tuple(sub_children[:n])))
            sub_children = sub_children[n:]
        elif is_tools:
            n = next(it_tools)
            out.setdefault(s, []).append(FanOut(j, TOOLS, tuple(tool_children[:n])))
            tool_children = tool_children[n:]
    return out


def _tool_calls(rng: np.random.Generator, n: int, p) -> list[Child]:
    """``n`` tool-call children: one request each, the tool's result as its prompt, after the tool's time."""
    prompt = lognormal_int(rng, p.tool_median, p.tool_sigma, n).tolist()
    output = lognormal_int(rng, p.response_median, p.response_sigma, n).tolist()
    gap = lognormal(rng, p.gap_median, p.gap_sigma, n).tolist()
    return [Child((a,), (b,), (g,)) for a, b, g in zip(prompt, output, gap)]


def _subagents(rng: np.random.Generator, n: int, p) -> list[Child]:
    """``n`` subagents: a task, then tool results turn after turn; the first turn starts as it is spawned."""
    turns = sample_turns(rng, p.subagent_turns_median, p.subagent_turns_mean, p.max_turns, n)
    total = int(turns.sum())
    starts = np.cumsum(turns) - turns
    first = np.zeros(total, dtype=bool)
    first[starts] = True
    prompt = np.where(first, lognormal_int(rng, p.task_median, p.task_sigma, total),
                      lognormal_int(rng, p.tool_median, p.tool_sigma, total)).tolist()
    output = lognormal_int(rng, p.response_median, p.response_sigma, total).tolist()
    gap = np.where(first, 0.0, lognormal(rng, p.gap_median, p.gap_sigma, total)).tolist()
    return [Child(tuple(prompt[a:a + k]), tuple(output[a:a + k]), tuple(gap[a:a + k]))
            for a, k in zip(starts.tolist(), turns.tolist())]


def expand_session(reqs: Sequence[TraceRequest], fans: Sequence[FanOut], ns: str, block_size: int) -> list[TraceRequest]:
    """One session's requests (its turns, in order) with its fan-outs: every request named (``id``), waiting for
    what it follows (``after``, ``gap_s``), its recorded time that of a cluster that answers at once, the children
    added, and the turns numbered again in time order."""
    name = reqs[0].session
    by_turn = {f.turn: f for f in fans}
    gaps = [0.0] + [b.t - a.t for a, b in zip(reqs, reqs[1:])]
    out: list[TraceRequest] = []
    before: tuple[str, ...] = ()
    ready = reqs[0].t  # the recorded time the next turn's gap counts from
    for j, r in enumerate(reqs):
        r.id, r.after, r.gap_s = f"{name}/{j}", before, gaps[j] if before else 0.0
        r.t = ready + r.gap_s if before else r.t
        out.append(r)
        before, ready = (r.id,), r.t
        f = by_turn.get(j)
        if f is not None:
            shared = r.input_tokens + r.output_tokens
            # the join's prompt holds this turn's prompt and answer, so its blocks cover the children's shared ones
            chain = reqs[j + 1].hash_ids[:shared // block_size]
            ends = [_child(out, r, k, c, shared, chain, ns, block_size) for k, c in enumerate(f.children)]
            before, ready = tuple(e.id or "" for e in ends), max(e.t for e in ends)
    out.sort(key=lambda x: x.t)
    for k, x in enumerate(out):
        x.turn = k
    return out


def _child(out: list[TraceRequest], parent: TraceRequest, k: int, child: Child, shared: int, chain: Sequence[int],
           ns: str, block_size: int) -> TraceRequest:
    """Append child ``k`` of ``parent``'s fan-out to ``out``, turn by turn; returns its last turn."""
    owner = f"{parent.id}.{k}"
    inputs = (shared + np.cumsum(child.prompt) + np.concatenate(([0], np.cumsum(child.output)[:-1]))).tolist()
    blocks = _session_chain(ns, owner, inputs[-1] // block_size, list(chain))
    prev = parent
    for i, (n_in, n_out, gap) in enumerate(zip(inputs, child.output, child.gap)):
        r = TraceRequest(prev.t + gap, parent.session, 0, blocks[:n_in // block_size], n_in, n_out, "agent",
                         id=f"{owner}/{i}", after=(prev.id or "",), gap_s=float(gap))
        out.append(r)
        prev = r
    return prev
