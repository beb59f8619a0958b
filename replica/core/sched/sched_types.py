"""What the scheduler takes and gives: its settings, a request's state, a step's result,
the compute-backend hook, the overload error and what an admission prefills (replica/core/sched/scheduler.py runs them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from replica.core.cache.pool import Allocation
from replica.core.sched.spec_decode import SpecDecode
from replica.core.tiers.stack import FetchPlan
from shared.errors import InputError, KvemuError
from shared.hashing import reusable_prefix_tokens
from shared.validate import check_number, check_positive_int

# Admission orders: fcfs (vLLM) or reorder (FlashGen, Jeong and Ahn, ASPLOS 2025). The flag that
# picks one (``--scheduler``) is in kvemu/options/scheduler.py; the core keeps values and checks.
ADMISSIONS = ("fcfs", "reorder")
SCHEDULERS = ADMISSIONS  # the name the CLI and settings use for the same values
DEFAULT_ADMISSION = "fcfs"
# Defaults every settings object of a replica's scheduler shares (CoreSettings, SimSettings,
# ReplicaSettings and the flags), so they cannot drift apart.
DEFAULT_TOKEN_BUDGET = 8192
DEFAULT_MAX_RUNNING = 256
DEFAULT_MAX_WAITING = 10_000  # a live replica answers 503 beyond; the simulator sizes it to the trace
# vLLM v0's block manager (the vLLM FlashGen compares against) admits a request only if this fraction of
# the pool stays free after it (``watermark=0.01`` there); vLLM v1 has none, hence 0 here.
DEFAULT_WATERMARK = 0.0
VLLM_V0_WATERMARK = 0.01
# reorder: how many times one request may be admitted ahead of its turn (each loan may end in a
# preemption; without a bound a request could be lent memory and taken back again and again)
DEFAULT_MAX_LOANS = 2


def check_admission(name: str, field: str = "scheduler") -> None:
    """An admission order named ``name`` exists (``field`` names the setting or flag in the error)."""
    if name not in ADMISSIONS:
        raise InputError(field, f"must be one of {', '.join(ADMISSIONS)}, got {name!r}")


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    token_budget: int = DEFAULT_TOKEN_BUDGET
    max_running: int = DEFAULT_MAX_RUNNING
    max_waiting: int = DEFAULT_MAX_WAITING
    admission: str = DEFAULT_ADMISSION  # the order requests are admitted in (ADMISSIONS); eviction is the pool's policy
    reorder_window: int = 32  # reorder: requests behind a blocked head tried for admission
    # Decode KV takes blocks as it fills them (vLLM; decode_kv.DecodeBlocks). False: only prompt
    # blocks count, as cache simulators do (the cache-only replay equals a one-at-a-time run then).
    decode_kv: bool = True
    # vLLM's max_model_len: a request whose prompt plus max_tokens exceeds it is refused (0: no
    # limit but the pool's; the settings above the core resolve it with ``max_model_len_for``)
    max_model_len: int = 0
    watermark: float = DEFAULT_WATERMARK  # fraction of the pool an admission must leave free (vLLM v0)
    max_loans: int = DEFAULT_MAX_LOANS  # reorder: admissions ahead of its turn one request may get
    step_rule: str = "v1"  # v1 (mixed steps) or v0 (prefills or decodes, whole prompts): v0_steps.py
    speculative: SpecDecode | None = None  # speculative decoding (spec_decode.py); None: one token a decode step

    def __post_init__(self) -> None:
        for name in ("token_budget", "max_running", "max_waiting", "reorder_window", "max_loans"):
            check_positive_int(name, getattr(self, name))
        check_admission(self.admission)
        check_watermark(self.watermark)
        if self.step_rule not in ("v1", "v0"):  # v0_steps.STEP_RULES (it imports this module)
            raise InputError("step_rule", f"must be one of v1, v0, got {self.step_rule!r}")
        if not isinstance(self.max_model_len, int) or self.max_model_len < 0:
            raise InputError("max_model_len", f"must be an integer >= 0, got {self.max_model_len!r}")
        spec = self.speculative
        if spec is not None:
            # every running request's 1 + K tokens fit one step (vLLM would leave some decoders out of a step)
            if self.max_running * (1 + spec.num_tokens) > self.token_budget:
                raise InputError("num_speculative_tokens", f"{self.max_running} running requests x (1 + {spec.num_tokens}"
                                 f" drafts) exceed the token budget of {self.token_budget}: lower"
                                 " --num-speculative-tokens or --max-running, or raise --token-budget")
            if self.step_rule != "v1":
                raise InputError("speculative_method", "speculative decoding runs with --step-rule v1 only")


def check_watermark(value: float, field: str = "watermark") -> None:
    check_number(field, value, minimum=0, maximum=0.5)  # more would leave most of the pool unused


def max_model_len_for(asked: int, capacity_blocks: int, block_size: int) -> int:
    """The length limit a replica runs with: ``asked`` (the flag, else the model's context window),
    or the pool's size in tokens where the pool cannot hold one request of that length (vLLM refuses
    to start then; kvemu warns and goes on with the pool's size, kvemu.options.limits)."""
    return min(asked, capacity_blocks * block_size)


class ContextLengthError(InputError):
    """vLLM's length rule: a request's prompt plus its ``max_tokens`` exceeds ``max_model_len`` (400)."""

    def __init__(self, limit: int, prompt_tokens: int, max_tokens: int):
        length = prompt_tokens + max_tokens
        # the prompt alone leaves no room for one output token: the prompt is what to change
        field = "prompt" if prompt_tokens >= limit else "max_tokens"
        super().__init__(field, f"this replica's maximum context length (max_model_len) is {limit} tokens,"
                                       f" but the request asks for {length} ({prompt_tokens} in the prompt, up to"
                                       f" {max_tokens} in the output); shorten the prompt or lower max_tokens")
        self.limit = limit
        self.length = length


class SchedRequest:
    """A request's state in the scheduler. A plain class, not a dataclass: mypyc compiles its
    ``__init__`` (a dataclass's is generated at import and runs interpreted, 3.5% of a default run),
    and a request equals only itself (the queues hold each request once)."""

    __slots__ = ("rid", "hashes", "input_tokens", "output_tokens", "arrival", "session", "next_use", "position",
                 "alloc", "segments", "cached_tokens", "generated", "base", "ready_at", "restore_start",
                 "response_hashes", "plan", "t_admitted", "t_first_token", "t_finished", "order", "t_queued",
                 "waited", "preemptions", "admit_seq", "extra_blocks", "grow_at", "kept", "loans", "hold", "full", "fills",
                 "fill_pins", "fill_at", "dups", "verifies")

    def __init__(self, rid: int, hashes: Sequence[int], input_tokens: int, output_tokens: int, arrival: float,
                 session: str | None = None, next_use: Sequence[float] | None = None, position: float | None = None,
                 *, response_hashes: Sequence[int] = ()) -> None:
        self.rid = rid
        self.hashes = hashes
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.arrival = arrival
        self.session = session
        self.next_use = next_use
        self.position = position  # oracles: the request's place in the access order (see next_use)
        # filled in by the scheduler
        self.alloc: Allocation | None = None
        self.segments: list[list[int]] = []  # [start_token, tokens] left to prefill
        self.cached_tokens = 0
        self.generated = 0  # exact once the request finished; while decoding see Scheduler._tick
        self.base = 0  # decode tick at which generated would have been 0 (the scheduler's bookkeeping)
        self.ready_at = 0.0  # when its restore from a lower memory tier ends (0: nothing restored)
        self.restore_start = 0.0  # when that restore's first copy into HBM starts
        # Hashes of the full blocks its response completes (chained after the prompt's): cached when
        # it finishes if the core keeps response KV (``keep_response_kv``); empty: nothing to keep.
        self.response_hashes = response_hashes
        self.plan: FetchPlan | None = None  # tiers: what its current acquisition restores
        self.t_admitted = -1.0
        self.t_first_token = -1.0
        self.t_finished = -1.0
        self.order = 0  # place in arrival order (submit); the waiting queue is kept sorted by it
        self.t_queued = -1.0  # when it last entered the waiting queue
        self.waited = 0.0  # seconds spent waiting, over every admission
        self.preemptions = 0
        self.admit_seq = 0  # admission number (the most recent is preempted first)
        self.extra_blocks = 0  # private blocks held beyond its hashed ones: partial prompt tail, decode KV
        self.grow_at = -1  # decode tick at which it next needs a block (-1: none; see DecodeBlocks)
        # Response blocks (``response_hashes[:kept]``) its allocation holds as hashed blocks: a request
        # preempted while decoding keeps the full blocks it generated cached (vLLM v1 hashes every full
        # block) and its re-admission looks them up after its prompt's, in HBM and below.
        self.kept = 0
        # Blocks its decoding fills are hashed as they fill (``DecodeBlocks.filled``, ``BlockPool.fill``):
        # ``response_hashes[:full]`` are full so far (the first ``kept`` in its allocation); the pool's
        # allocations of those it pinned in place of private blocks, released with its own, latest first;
        # how many blocks those hold; the decode tick at which its next block is full (-1: none).
        self.full = 0
        self.fills: list[Allocation] = []
        self.fill_pins = 0
        self.fill_at = -1
        # Filled blocks it holds as private blocks because another running request pinned the same hash
        # (vLLM: two copies); it pins the hashed one once that request lets go (``Scheduler._adopt``).
        self.dups: list[int] = []
        self.loans = 0  # reorder: times it was admitted ahead of its turn (at most max_loans)
        self.verifies = 0  # speculative decoding: its verify steps so far (the acceptance model's draw number)
        # A prefill instance's request (disaggregated P/D): when it finishes its blocks stay pinned until
        # the KV transfer to the decode instance ends (``Scheduler.release_held``), as vLLM's NIXL
        # connector holds them; False everywhere else.
        self.hold = False

    def __repr__(self) -> str:
        return (f"SchedRequest(rid={self.rid!r}, session={self.session!r}, blocks={len(self.hashes)},"
                f" input_tokens={self.input_tokens}, output_tokens={self.output_tokens}, arrival={self.arrival})")

    @property
    def resumed(self) -> bool:
        """Preempted after its first token: re-admission recomputes its prompt and generated tokens."""
        return self.t_first_token >= 0

    @property
    def prefilling(self) -> bool:
        return bool(self.segments)


class StepResult:
    """One step's (or fast-forwarded run's) outcome; a plain class for mypyc, as ``SchedRequest``."""

    __slots__ = ("start", "duration", "steps", "prefill_tokens", "first_tokens", "finished", "decoded")

    def __init__(self, start: float, duration: float, steps: int, prefill_tokens: int,
                 first_tokens: list[SchedRequest], finished: list[SchedRequest],
                 decoded: list[tuple[SchedRequest, int]]) -> None:
        self.start = start
        self.duration = duration
        self.steps = steps
        self.prefill_tokens = prefill_tokens
        self.first_tokens = first_tokens
        self.finished = finished
        self.decoded = decoded  # (request, tokens generated in this step(s))


class StepTimer(Protocol):
    """A compute backend that runs a step's work for real and says how long it took (the torch
    backend, replica/backends/); without one the step costs what the cost model says."""

    def step_time(self, chunks: list[tuple[SchedRequest, int, int]], decoders: list[SchedRequest], steps: int,
                  modelled: float) -> float: ...

    def stored(self, r: SchedRequest, hashes: list[int]) -> None:
        """``r`` finished and its response blocks ``hashes`` were cached: give them their K/V."""


class QueueFullError(KvemuError):
    """Overload, not bad input: answered 503 with Retry-After so a router tries elsewhere."""

    def __init__(self, limit: int):
        super().__init__(f"waiting queue is full ({limit} requests)")


def prefill_len(req: SchedRequest) -> int:
    """Tokens an admission prefills before any cache hit: the prompt, and the generated tokens
    of a request preempted after its first token."""
    return req.input_tokens + (req.generated if req.resumed else 0)


def prefill_segments(req: SchedRequest, hit_idx: list[int], block_size: int, extra: int = 0) -> list[list[int]]:
    """Token ranges to compute: blocks not reused (holes included), the partial tail, and ``extra``
    tokens after the prompt (a preempted request's generated tokens)."""
    n_blocks = len(req.hashes)
    segments: list[list[int]] = []
    prev = -1  # gaps between consecutive reused blocks are the holes to recompute
    if hit_idx and hit_idx[-1] != len(hit_idx) - 1:
        for i in hit_idx:
            if i > prev + 1:
                segments.append([(prev + 1) * block_size, (i - prev - 1) * block_size])
            prev = i
    else:
        prev = len(hit_idx) - 1  # a leading run (or nothing) reused: one range after it
    full = n_blocks * block_size
    # The prompt ends at input_tokens: after its blocks (an unhashed partial tail), or inside its
    # last block when that block's id covers a partial block (Mooncake's last hash id). Only a
    # trace with more ids than tokens would end before its last block: its blocks count then.
    end = (req.input_tokens if req.input_tokens > full - block_size else full) + extra
    start = (prev + 1) * block_size
    if end > start:
        segments.append([start, end - start])
    if not segments:
        # Everything cached: the last block is computed again (the one rule, reusable_prefix_tokens)
        end = req.input_tokens + extra
        start = reusable_prefix_tokens(end, end, block_size)
        segments.append([start, max(end - start, 1)])
    return segments
