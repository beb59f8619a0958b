"""The trace record every part of kvemu exchanges: one request of one session turn."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from shared.gc_tuning import gc_paused


@dataclass(slots=True)
class TraceRequest:
    t: float  # seconds from trace start
    session: str
    turn: int  # 0-based within the session
    hash_ids: list[int]  # chained hashes of the prompt's blocks at the trace's block size
    input_tokens: int
    output_tokens: int
    kind: str | None = None  # single | multi | agent
    # The prompt's token ids, then the output's where the trace gives them (token-id traces, e.g.
    # LLMServingSim's workloads); None for traces of hashes. The response's blocks hash from them.
    token_ids: list[int] | None = None
    # Dependent arrivals (an agent's turns; ``loadgen.dependencies`` checks them, ``loadgen.arrivals`` runs
    # them): the request's name in its trace, the names it waits for, and the tool or think time after the
    # last of them finishes. With no ``after`` the request arrives at ``t``.
    id: str | None = None
    after: tuple[str, ...] = ()
    gap_s: float = 0.0


# A ``Trace.meta`` key: True where every ``hash_ids`` entry is known to be an int in [0, 2**64) (the
# readers check them, the presets make them by xxhash), so the simulator need not look again.
HASHES_U64 = "hashes_u64"


@dataclass(slots=True)
class Trace:
    requests: list[TraceRequest]
    block_size: int
    source: str = ""  # file path or workload name
    meta: dict = field(default_factory=dict)


def has_dependencies(trace: Trace | Sequence[TraceRequest]) -> bool:
    """Whether any request waits for another (``after``)."""
    requests = trace.requests if isinstance(trace, Trace) else trace
    return any(r.after for r in requests)


def shared_prefix(a, b) -> int:
    """How many leading hashes ``a`` and ``b`` share (a session's turn and the one before)."""
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):  # the common case (a next turn extends the previous prompt), in C
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def response_hashes(trace: Trace) -> list[list[int]]:
    """Per request: the hashes of the full blocks its response completes, chained after its prompt.

    A colocated server caches them (``--response-kv keep``). The response is where the session's
    next turn continues the conversation, so when that turn's prompt extends this one, its
    blocks at those depths are the response's. Otherwise (the last turn, or a next prompt that
    does not extend this one) they get hashes of their own, chained after the prompt, that no
    later prompt shares. Where the trace gives the response's token ids (``token_ids``), its blocks hash
    from them, as vLLM's prefix cache hashes them. A request whose response completes no block gets none.
    """
    from shared.hashing import ROOT_HASH, block_hashes, chain_ids, content_id

    reqs = trace.requests
    bs = trace.block_size
    blocks = [(r.input_tokens + r.output_tokens) // bs - len(r.hash_ids) for r in reqs]
    with gc_paused():  # 240,000 fresh lists would run full collections over the whole trace
        out: list[list[int]] = [[] for _ in reqs]
    # Only the sessions of requests whose response completes a block need their next turns found
    # (most of a trace of large blocks, e.g. Mooncake's 512 tokens, completes none).
    needed = {reqs[k].session for k, m in enumerate(blocks) if m > 0}
    if not needed:
        return out
    nxt: dict[int, int] = {}
    last_of: dict[str, int] = {}
    ks = [k for k, r in enumerate(reqs) if r.session in needed]
    for k in sorted(ks, key=lambda k: (reqs[k].session, reqs[k].turn, reqs[k].t)):
        prev = last_of.get(reqs[k].session)
        if prev is not None:
            nxt[prev] = k
        last_of[reqs[k].session] = k
    for k, m in enumerate(blocks):
        if m <= 0:
            continue
        r = reqs[k]
        own = r.hash_ids
        ids = r.token_ids
        if ids is not None and len(ids) >= r.input_tokens + r.output_tokens:
            # the response's own tokens, hashed as vLLM hashes every full block: a later prompt that contains
            # them hits, whatever its session
            out[k] = block_hashes(ids[len(own) * bs:r.input_tokens + r.output_tokens], bs, own[-1] if own else ROOT_HASH)
            continue
        j = nxt.get(k)
        later = reqs[j].hash_ids if j is not None else None
        if later is not None and len(later) > len(own) and later[:len(own)] == own:
            out[k] = later[len(own):len(own) + m]
        else:
            parent = own[-1] if own else 0
            out[k] = chain_ids((content_id("response", r.session, r.turn, i) for i in range(m)), parent)
    return out


def infinite_cache_hit_ratio(requests: Sequence[TraceRequest],
                             responses: Sequence[Sequence[int]] | None = None) -> float | None:
    """1 - first accesses / block accesses of ``requests`` (in order): no capacity, policy or replica
    count does better. ``responses[k]``: the blocks request k's response puts in the cache (response
    KV kept, see ``response_hashes``); a later prompt that reaches them can hit them."""
    seen: set[int] = set()
    accesses = first = 0
    for k, r in enumerate(requests):
        hashes = r.hash_ids
        accesses += len(hashes)
        first += len(hashes) - sum(map(seen.__contains__, hashes))
        seen.update(hashes)
        if responses is not None:
            seen.update(responses[k])
    return 1.0 - first / accesses if accesses else None
