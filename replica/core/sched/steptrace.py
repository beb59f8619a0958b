"""kvemu's scheduler, step by step, on a workload recorded from vLLM's own scheduler
(bench/record_vllm_steps.py, docs/vllm-conformance.md): one function the golden tests and the
recorder's comparison share, so both judge the same trace.

A workload is plain JSON: ``settings`` (block_size, num_blocks, max_num_batched_tokens,
max_num_seqs, max_model_len, prefix_caching) and ``requests``, each ``{"id", "arrive": step,
"prompt": pieces, "output": pieces}``, and ``aborts`` (``{"id", "step"}``). A piece ``[tag, n]``
is ``n`` token ids made from ``tag`` (``piece_tokens``): two prompts that start with the same
pieces share that prefix token for token. No clock: step ``k`` starts at time ``k`` and the
scheduler is told to take one step (its decode fast-forward stops at ``now``).

A step's record: ``scheduled`` (request -> tokens computed in it), ``cached`` (for each request
admitted in it, the tokens found computed: its first chunk's start), ``preempted`` (in order),
``finished`` (in order), ``refused`` (vLLM's length rule at arrival) and ``aborted``.

KV cache groups (``settings["kv_groups"]``, ``[[kind, window], ...]``: ``full`` or ``window`` of that many tokens):
one group per entry on a ``GroupedPool``, as vLLM's hybrid manager keeps them.

Speculative decoding (``settings["speculative"]``, ``{"method", "k"}``): a decoder's ``scheduled`` is its
sampled token and its drafts, and each request's ``accept`` list forces what its verifications accept
(``ForcedAcceptance``), the same list vLLM's driver feeds its scheduler.
"""

from __future__ import annotations

from collections.abc import Sequence

from replica.core.cache.grouped import GroupedPool
from replica.core.cache.policies.lru import LRUPolicy
from replica.core.cache.pool import BlockPool
from replica.core.sched.sched_types import SchedRequest, SchedulerSettings
from replica.core.sched.scheduler import Scheduler
from replica.core.sched.spec_decode import ForcedAcceptance, SpecDecode
from shared.costmodel import CostModel
from shared.errors import InputError
from shared.hashing import block_hashes
from shared.kv_groups import KvGroup, KvGroups

VOCAB = 30_000  # token ids stay below every preset's vocabulary
MAX_STEPS = 100_000


def piece_tokens(pieces: Sequence[Sequence[int]]) -> list[int]:
    """The token ids of ``[tag, n]`` pieces: token ``i`` of tag ``t`` is a fixed function of both."""
    out: list[int] = []
    for tag, n in pieces:
        out.extend((tag * 1_000_003 + i * 7_919 + 1) % VOCAB + 1 for i in range(n))
    return out


def expand(workload: dict) -> dict:
    """The workload with explicit token ids (what vLLM's driver takes)."""
    reqs = [{**r, "prompt": piece_tokens(r["prompt"]), "output": piece_tokens(r["output"])}
            for r in workload["requests"]]
    return {**workload, "requests": reqs}


class _Recorder:
    """The scheduler's step timer: it hears each step's chunks and decoders (and keeps the modelled time)."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.chunks: list[tuple[SchedRequest, int, int]] = []
        self.decoders: list[SchedRequest] = []
        self.drafts: dict[int, int] = {}  # id(request) -> its drafts this step

    def step_time(self, chunks: list[tuple[SchedRequest, int, int]], decoders: list[SchedRequest], steps: int,
                  modelled: float) -> float:
        self.chunks, self.decoders = list(chunks), list(decoders)
        self.drafts = {id(r): d for r, d in self.sched.planned_drafts}
        return modelled

    def stored(self, r: SchedRequest, hashes: list[int]) -> None:
        pass


def scheduler_for(settings: dict, cost: CostModel | None = None) -> Scheduler:
    """kvemu's scheduler with vLLM's settings: a block pool of ``num_blocks`` with vLLM's free-queue
    order (LRU), prefix hits only, response KV cached (vLLM caches every full block it computes)."""
    bs, caching = settings["block_size"], settings["prefix_caching"]
    # vLLM's block pool keeps one of its num_gpu_blocks as the null block, never handed out
    base = BlockPool(settings["num_blocks"] - 1, LRUPolicy(), block_size=bs, hit_mode="prefix", emit_events=False,
                     prefix_caching=caching)
    kinds = settings.get("kv_groups")  # vLLM's hybrid manager: one group per [kind, window], a layer each
    pool: BlockPool | GroupedPool = base
    if kinds:
        pool = GroupedPool(base, KvGroups(tuple(KvGroup(kind, 1, window) for kind, window in kinds), 1))
        pool.in_flight = 2 * settings["max_num_batched_tokens"]  # async scheduling: two steps in flight
    spec = settings.get("speculative")
    sched_settings = SchedulerSettings(token_budget=settings["max_num_batched_tokens"],
                                       max_running=settings["max_num_seqs"],
                                       max_model_len=settings["max_model_len"], max_waiting=1 << 30,
                                       speculative=SpecDecode(spec["method"], spec["k"], acceptance_rate=1.0)
                                       if spec else None)
    return Scheduler(pool, cost or CostModel.from_names(), sched_settings, keep_response_kv=caching)


def _request(i: int, r: dict, bs: int, arrival: float) -> SchedRequest:
    prompt, output = piece_tokens(r["prompt"]), piece_tokens(r["output"])
    full = block_hashes(prompt + output[:-1], bs)  # the last output token's KV is never computed
    n = len(prompt) // bs
    return SchedRequest(i, full[:n], len(prompt), len(output), arrival, response_hashes=full[n:])


def kvemu_trace(workload: dict, cost: CostModel | None = None) -> list[dict]:
    """The steps kvemu's scheduler takes on ``workload``, recorded as the vLLM recorder records vLLM's."""
    s = workload["settings"]
    sched = scheduler_for(s, cost)
    if s.get("speculative"):  # what each verification accepts: the workload's lists, as vLLM's driver reads them
        sched.acceptance = ForcedAcceptance({i: r.get("accept", []) for i, r in enumerate(workload["requests"])})
    rec = _Recorder(sched)
    sched.timer = rec
    names = {i: r["id"] for i, r in enumerate(workload["requests"])}
    preempted: list[str] = []
    sched.on_preempt = lambda r, now: preempted.append(names[r.rid])
    arrivals: dict[int, list[tuple[int, dict]]] = {}
    for i, r in enumerate(workload["requests"]):
        arrivals.setdefault(r["arrive"], []).append((i, r))
    aborts: dict[int, list[str]] = {}
    for a in workload.get("aborts", []):
        aborts.setdefault(a["step"], []).append(a["id"])
    live: dict[str, SchedRequest] = {}
    last_event = max([*arrivals, *aborts, 0])
    steps = []
    for k in range(MAX_STEPS):
        now = float(k)
        refused = []
        for i, r in arrivals.get(k, []):
            req = _request(i, r, s["block_size"], now)
            try:
                sched.submit(req)
            except InputError:
                refused.append(r["id"])
                continue
            live[r["id"]] = req
        aborted = [rid for rid in aborts.get(k, []) if rid in live and sched.abort(live[rid], now)]
        for rid in aborted:
            del live[rid]
        preempted.clear()
        rec.chunks, rec.decoders, rec.drafts = [], [], {}
        result = sched.step(now, horizon=now)
        scheduled: dict[str, int] = {}
        cached: dict[str, int] = {}
        for r, start, take in rec.chunks:
            name = names[r.rid]
            if name not in scheduled and r.t_admitted == now:
                cached[name] = start
            scheduled[name] = scheduled.get(name, 0) + take
        for r in rec.decoders:
            scheduled[names[r.rid]] = scheduled.get(names[r.rid], 0) + 1 + rec.drafts.get(id(r), 0)
        finished = [names[r.rid] for r in result.finished]
        for rid in finished:
            live.pop(rid, None)
        steps.append({"step": k, "scheduled": scheduled, "cached": cached, "preempted": list(preempted),
                      "finished": finished, "refused": refused, "aborted": aborted})
        if k >= last_event and not sched.has_work():
            break
    return steps


def compare(ours: list[dict], theirs: list[dict]) -> dict:
    """Steps that agree exactly (every field, ``scheduled`` and ``cached`` as maps), the first that
    does not, and the preemptions each made."""
    n = max(len(ours), len(theirs))
    same = sum(1 for a, b in zip(ours, theirs) if a == b)
    first = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if first is None and len(ours) != len(theirs):
        first = min(len(ours), len(theirs))
    return {"steps": n, "agree": same, "first_difference": first,
            "preemptions_kvemu": sum(len(s["preempted"]) for s in ours),
            "preemptions_vllm": sum(len(s["preempted"]) for s in theirs)}
