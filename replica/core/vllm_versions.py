"""The engine rules that changed across vLLM's releases, one row per change (``--vllm-version X.Y.Z``).

Each row is the release a rule changed in and every rule from then on; a release between two rows runs
the rules of the row at or below it. Where each row comes from (release notes, pull requests, the
source) is in docs/vllm-conformance.md, "Earlier vLLM releases".

What a row sets in kvemu (``VllmRules.settings``: the step rule, prefix caching, the watermark, the
token budget, the running cap) is what kvemu models. The rest of a row names what kvemu does not model,
so a comparison with an old engine can say what is missing: CUDA graphs (kvemu prices decode steps as
graph replays whatever the release), prompts padded to the longest of their step, async scheduling,
the host's work per step (kvemu prices GPU time only), and the memory rule's terms beyond weights and
activations (``CostModel.kv_budget`` prices those two; the others are named, not priced).

kvemu follows ``NEWEST`` (the release its scheduler is recorded against, bench/record_vllm_steps.py);
a later release's rules are unknown here and refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from shared.errors import InputError
from shared.memory_rule import ACTIVATIONS, GRAPH_MEMORY, NON_TORCH, WEIGHTS

Version = tuple[int, int, int]
GIB = 1024**3

NEWEST: Version = (0, 33, 0)  # bench/record_vllm_steps.py's VLLM_VERSION: docs/vllm-conformance.md

# What a row says of a feature: not in that release, in it but off unless asked for, on by default.
ABSENT, OFF, ON = "absent", "off", "on"
# The memory rule's terms (shared/memory_rule.py prices them), subtracted from gpu_memory_utilization x the
# GPU's memory to size the KV cache.
PRICED_TERMS = (WEIGHTS, ACTIVATIONS, NON_TORCH)  # what shared.memory_rule prices (CUDA-graph memory: not yet)


@dataclass(frozen=True, slots=True)
class GpuTier:
    """vLLM's defaults on GPUs of at least ``min_gib`` GiB (a name containing ``excluded`` never qualifies:
    vLLM keeps the A100 on the small defaults, where larger steps lowered its throughput)."""

    min_gib: float
    max_num_batched_tokens: int
    max_num_seqs: int
    excluded: str = ""


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """What a row gives kvemu's settings, each where the user did not give its flag."""

    step_rule: str  # "v0": prefills of whole prompts or decodes (v0_steps); "v1": mixed steps, chunked prefill
    prefix_caching: str  # "on" / "off"
    watermark: float
    token_budget: int
    max_running: int


@dataclass(frozen=True, slots=True)
class VllmRules:
    since: Version  # the first release with these rules
    engine: str  # "v0" (one step prefills or decodes) or "v1" (one unified step)
    prefix_caching: str  # ABSENT / OFF / ON (by default)
    chunked_prefill: str  # ABSENT / OFF / ON (by default)
    cuda_graphs: bool  # decode steps replay captured CUDA graphs by default
    # max_num_batched_tokens by default: this many, or with floor_model_len max(max_model_len, this);
    # on GPUs of a tier (the first that fits, largest first) the tier's
    max_num_batched_tokens: int
    max_num_seqs: int
    floor_model_len: bool = False
    tiers: tuple[GpuTier, ...] = ()
    watermark: float = 0.0  # the block manager admits only while this fraction of blocks stays free
    max_paddings: int = 0  # > 0: a step's prompts padded to the longest, at most this many pad tokens
    preemption: str = "recompute"  # of a request with one sequence (swap: only groups of several, v0)
    async_scheduling: bool = False  # step N+1 scheduled while step N runs on the GPU
    host_work: str = "synchronous"  # the engine's CPU work per step and what it overlaps
    memory_terms: tuple[str, ...] = PRICED_TERMS
    source: str = ""

    @property
    def release(self) -> str:
        return ".".join(map(str, self.since))

    def settings(self, max_model_len: int, gpu_bytes: float, gpu_name: str) -> EngineSettings:
        """kvemu's settings under these rules, for a model of ``max_model_len`` tokens on a GPU of
        ``gpu_bytes`` of memory named ``gpu_name``."""
        tokens, seqs = self.max_num_batched_tokens, self.max_num_seqs
        for tier in self.tiers:
            if gpu_bytes >= tier.min_gib * GIB and not (tier.excluded and tier.excluded in gpu_name.lower()):
                tokens, seqs = tier.max_num_batched_tokens, tier.max_num_seqs
                break
        if self.floor_model_len:
            tokens = max(max_model_len, tokens)
        # v0 without chunked prefill is kvemu's v0 step rule; v0 with it on by default schedules decodes
        # and prefill chunks in one step, as kvemu's v1 rule does
        step_rule = "v0" if self.engine == "v0" and self.chunked_prefill != ON else "v1"
        return EngineSettings(step_rule, "on" if self.prefix_caching == ON else "off", self.watermark, tokens,
                              seqs)

    def unmodelled(self) -> list[str]:
        """What these rules do that kvemu does not model, in a few words each."""
        out = [] if self.cuda_graphs else ["no CUDA graphs (every step eager)"]
        if self.max_paddings:
            out.append(f"prompts padded to the longest of their step (max_paddings {self.max_paddings})")
        if self.async_scheduling:
            out.append("async scheduling")
        out.append(f"host work: {self.host_work}")
        out += [f"{term} in the memory rule" for term in self.memory_terms if term not in PRICED_TERMS]
        return out


_SYNC = "synchronous: schedule, prepare inputs, forward, sample, detokenize, one after another"
_SERVE_TIER = GpuTier(70, 8192, 1024, excluded="a100")

# One row per change, oldest first. A version between rows takes the row at or below it.
RULES: tuple[VllmRules, ...] = (
    VllmRules((0, 1, 0), prefix_caching=ABSENT, chunked_prefill=ABSENT, cuda_graphs=False,
              max_num_batched_tokens=2560,
              engine="v0", max_num_seqs=256, watermark=0.01,
              host_work=_SYNC,
              source="EngineArgs 0.1.x: max_num_batched_tokens 2560, max_num_seqs 256, block manager watermark 0.01"),
    VllmRules((0, 2, 2), prefix_caching=ABSENT, chunked_prefill=ABSENT, cuda_graphs=False,
              max_num_batched_tokens=2048, floor_model_len=True, max_paddings=256,
              engine="v0", max_num_seqs=256, watermark=0.01,
              host_work=_SYNC,
              source="SchedulerConfig: max_num_batched_tokens None -> max(max_model_len, 2048); max_paddings 256;"
                     " prompts padded to [num_prompts, longest prompt]"),
    VllmRules((0, 2, 6), prefix_caching=ABSENT, chunked_prefill=ABSENT, cuda_graphs=True,
              max_num_batched_tokens=2048, floor_model_len=True, max_paddings=256,
              engine="v0", max_num_seqs=256, watermark=0.01,
              host_work=_SYNC,
              source="CUDA graphs for decode steps (vLLM PR #1926, --enforce-eager to turn off)"),
    VllmRules((0, 4, 0), prefix_caching=OFF, chunked_prefill=OFF, cuda_graphs=True,
              max_num_batched_tokens=2048, floor_model_len=True,
              engine="v0", max_num_seqs=256, watermark=0.01,
              host_work=_SYNC,
              source="automatic prefix caching (--enable-prefix-caching) and chunked prefill"
                     " (--enable-chunked-prefill) added, both off; prompts flattened, not padded"),
    VllmRules((0, 6, 0), prefix_caching=OFF, chunked_prefill=OFF, cuda_graphs=True,
              max_num_batched_tokens=2048, floor_model_len=True,
              engine="v0", max_num_seqs=256, watermark=0.01,
              host_work="output processing overlapped with the next step's forward",
              source="async output processing on by default"),
    VllmRules((0, 8, 0), engine="v1", prefix_caching=ON, chunked_prefill=ON, cuda_graphs=True,
              max_num_batched_tokens=2048, max_num_seqs=256,
              host_work="engine core in its own process; detokenizing in the front end",
              memory_terms=(WEIGHTS, ACTIVATIONS, NON_TORCH),
              source="V1 engine by default: unified steps, chunked prefill always, prefix caching on;"
                     " serve defaults max_num_batched_tokens 2048, max_num_seqs 256"),
    VllmRules((0, 9, 0), engine="v1", prefix_caching=ON, chunked_prefill=ON, cuda_graphs=True,
              max_num_batched_tokens=2048, max_num_seqs=256, tiers=(_SERVE_TIER,),
              host_work="engine core in its own process; detokenizing in the front end",
              memory_terms=(WEIGHTS, ACTIVATIONS, NON_TORCH),
              source="GPUs of 70 GiB or more but the A100: serve defaults 8192 tokens, 1024 sequences"),
    VllmRules((0, 14, 0), engine="v1", prefix_caching=ON, chunked_prefill=ON, cuda_graphs=True,
              max_num_batched_tokens=2048, max_num_seqs=256, tiers=(_SERVE_TIER,), async_scheduling=True,
              host_work="scheduling of step N+1 overlapped with step N's forward",
              memory_terms=(WEIGHTS, ACTIVATIONS, NON_TORCH),
              source="async scheduling on by default"),
    VllmRules((0, 21, 0), engine="v1", prefix_caching=ON, chunked_prefill=ON, cuda_graphs=True,
              max_num_batched_tokens=2048, max_num_seqs=256, tiers=(_SERVE_TIER,), async_scheduling=True,
              host_work="scheduling of step N+1 overlapped with step N's forward",
              memory_terms=(WEIGHTS, ACTIVATIONS, NON_TORCH, GRAPH_MEMORY),
              source="CUDA-graph memory profiled and subtracted from the KV cache by default"),
    VllmRules((0, 33, 0), engine="v1", prefix_caching=ON, chunked_prefill=ON, cuda_graphs=True,
              max_num_batched_tokens=2048, max_num_seqs=256,
              tiers=(GpuTier(160, 16384, 1024), _SERVE_TIER), async_scheduling=True,
              host_work="scheduling of step N+1 overlapped with step N's forward",
              memory_terms=(WEIGHTS, ACTIVATIONS, NON_TORCH, GRAPH_MEMORY),
              source="GPUs of 160 GiB or more: 16384 tokens, 1024 sequences (EngineArgs.get_batch_defaults)"),
)

_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")


def parse_version(text: str, field: str = "vllm_version") -> Version:
    """``"0.2.3"`` (or ``"v0.2.3"``, as vLLM tags it) -> (0, 2, 3); anything else refused naming ``field``."""
    found = _VERSION.fullmatch(text.strip()) if isinstance(text, str) else None
    if found is None:
        raise InputError(field, f"expected a vLLM release as X.Y.Z (e.g. 0.2.3), got {text!r}")
    major, minor, patch = (int(g) for g in found.groups())
    return major, minor, patch


def rules_for(text: str, field: str = "vllm_version") -> VllmRules:
    """The rules release ``text`` runs: the row at or below it. Releases before vLLM's first and after the
    newest kvemu follows are refused in one line naming ``field``."""
    version = parse_version(text, field)
    newest = ".".join(map(str, NEWEST))
    if version > NEWEST:
        raise InputError(field, f"kvemu follows vLLM up to {newest}; the rules of {text} are not known here:"
                                f" give {newest} or an earlier release")
    if version < RULES[0].since:
        raise InputError(field, f"vLLM's first release is {RULES[0].release}; got {text}")
    return [row for row in RULES if row.since <= version][-1]
