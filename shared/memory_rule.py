"""vLLM's memory rule (``--gpu-memory-utilization``): what the profiling step at start leaves for KV.

vLLM (v1 engine, ``Worker.determine_available_memory`` with ``memory_profiling`` from vllm/utils/mem_utils.py)
takes ``requested = ceil(total x gpu_memory_utilization)``, where ``total`` is what CUDA reports
(``cudaMemGetInfo``), and subtracts its non-KV memory: the weights (what loading the model took), the
increase of torch's peak allocation over one profiling run (``profile_run``: a forward of
max_num_batched_tokens tokens, then the dummy sampler run over min(max_num_seqs, max_num_batched_tokens)
rows), the memory outside torch's pool that appeared since the worker started (CUDA modules, cuBLAS and
NCCL buffers), and, in the releases that estimate it, the CUDA graphs' memory. What is left, over the
page size of one block (every layer's K and V of ``block_size`` tokens), is the block count. Each term's
figure and its source are below; ``KvBudget`` carries them all (the start line, ``/stats``, the sim JSON).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from shared.errors import InputError
from shared.kv_groups import FULL, WINDOW, KvGroups

# The rule's terms, by name (replica/core/vllm_versions.py says which each vLLM release subtracts)
WEIGHTS, ACTIVATIONS, NON_TORCH, GRAPH_MEMORY = "weights", "activations", "non-torch memory", "CUDA-graph memory"

if TYPE_CHECKING:
    from shared.costmodel import CostModel

GIB = 1024**3
MIB = 1024**2

# The device's total as CUDA gives it to the process (torch.cuda.mem_get_info), which is less than
# nvidia-smi's figure (the presets' memory_bytes). RTX 4090: 25,250,627,584 bytes, the LLMServingSim run's
# meta.json (torch's device_total_memory_bytes; nvidia-smi 24,564 MiB, 483 MiB more). H100 SXM 80GB:
# 85,029,158,912 bytes (79.19 GiB), CUDA's totalGlobalMem as deviceQuery gives it and as llm-d-planner's
# vLLM 0.19.0 accuracy report measured it (nvidia-smi 81,559 MiB, 469 MiB more).
CUDA_TOTAL_BYTES = {"rtx-4090": 25_250_627_584, "h100": 85_029_158_912}
# A card with no measured total: nvidia-smi's figure less the mean of the two measured differences
# (483 and 469 MiB), what the driver keeps for itself (an estimate, not a measurement of that card).
DRIVER_RESERVE_BYTES = 476 * MIB

# Non-torch memory per GPU after the profiling run, as vLLM 0.19.0 logs it (llm-d-planner's accuracy
# report, docs/accuracy/vllm-v0.19.0-accuracy-report.md, H100-80GB, Llama-3.1-8B-Instruct): 0.25 GiB at
# TP 1 (CUDA modules, cuBLAS), 2.07 GiB at TP 2 and 2.13 GiB at TP 4 (NCCL and custom all-reduce buffers);
# any other TP above 1: their 2.10 GiB constant. Measured on H100s only: other cards are assumed the same.
NON_TORCH_GIB = {1: 0.25, 2: 2.07, 4: 2.13}
NON_TORCH_OTHER_TP_GIB = 2.10

# The dummy sampler run's bytes per logit (rows x vocab) alive at its peak, on vLLM's PyTorch sampling
# path (vllm/v1/sample: Sampler.forward, apply_top_k_top_p; the dummy run sets temperature, top-k and
# top-p): the logits in the model's dtype (2, held by the caller), their fp32 copy (4), the sort's
# values (4) and int64 indices (8), the top-k mask (1), the top-p softmax of the sorted values (4,
# cumsum in place), the top-p mask (1) and the scatter back to vocab order (4) = 28. FlashInfer's
# sampler does not sort: vLLM 0.19.0's 1.89 GiB peak for Llama-3.1-8B at 1,024 rows on an H100 (the
# same report) is about 15 bytes a logit, so a run on that path gets more blocks than this rule gives.
SAMPLER_BYTES_PER_LOGIT = 28


def cuda_total_bytes(gpu_name: str, smi_bytes: float) -> tuple[float, str]:
    """One GPU's memory as CUDA reports it, and where the figure comes from."""
    if gpu_name in CUDA_TOTAL_BYTES:
        return float(CUDA_TOTAL_BYTES[gpu_name]), "measured (CUDA)"
    return smi_bytes - DRIVER_RESERVE_BYTES, "nvidia-smi less 476 MiB (estimated)"


def non_torch_bytes(tp: int) -> float:
    return NON_TORCH_GIB.get(tp, NON_TORCH_OTHER_TP_GIB if tp > 1 else NON_TORCH_GIB[1]) * GIB


@dataclass(frozen=True, slots=True)
class KvBudget:
    """The KV capacity ``--gpu-memory-utilization`` gives, term by term, bytes per GPU."""

    utilization: float
    device_bytes: float  # one GPU's memory as CUDA reports it
    tp: int
    weight_bytes: float  # one GPU's share of the weights, the norms and the rotary cache
    activation_bytes: float  # the profiling run's peak increase on one GPU
    kv_bytes: float  # left for KV on one GPU (<= 0: nothing)
    blocks: int  # KV blocks of the replica (the same count on each of its tp GPUs)
    block_size: int
    model: str
    gpu: str
    non_torch_bytes: float = 0.0  # memory outside torch's pool after the profiling run
    graph_bytes: float = 0.0  # the CUDA graphs' estimate (0: the release does not subtract it, or unpriced)
    requested_bytes: float = 0.0  # ceil(device_bytes x utilization)
    device_source: str = ""
    forward_bytes: float = 0.0  # the forward's peak working set (activation_bytes is the larger of it and ...)
    sampler_bytes: float = 0.0  # ... the sampler run's, the forward's output still alive
    terms: tuple[str, ...] = (WEIGHTS, ACTIVATIONS, NON_TORCH)
    # a model of several KV cache groups: the start line's words on them (groups_note); the JSON's kv_groups
    # section has the groups, so breakdown() leaves it out
    groups_note: str = ""

    def breakdown(self) -> dict:
        """The terms for ``/stats`` and the sim JSON (bytes per GPU; blocks per replica)."""
        out = asdict(self)
        del out["groups_note"]
        return out

    def line(self) -> str:
        """What a command prints at start: per GPU, then the replica's (tp GPUs) in GiB and blocks."""
        per = (f"ceil({self.utilization:g} x {self.device_bytes / GIB:.2f} GiB of {self.gpu}) -"
               f" {self.weight_bytes / GIB:.2f} GiB weights - {self.activation_bytes / GIB:.2f} GiB activations -"
               f" {self.non_torch_bytes / GIB:.2f} GiB non-torch"
               f"{f' - {self.graph_bytes / GIB:.2f} GiB CUDA graphs' if self.graph_bytes else ''}"
               f" = {self.kv_bytes / GIB:.2f} GiB of KV per GPU")
        replica = f" x {self.tp} GPUs (--tp {self.tp}) = {self.tp * self.kv_bytes / GIB:.2f} GiB" if self.tp > 1 else ""
        return (f"capacity ({self.model}): {per}{replica}: {self.blocks:,} blocks of {self.block_size} tokens"
                f"{self.groups_note}")

    def check(self) -> int:
        """The blocks, or a one-line refusal when nothing is left for KV."""
        if self.blocks < 1:
            raise InputError("--gpu-memory-utilization",
                             f"nothing left for KV: {self.utilization:g} x {self.device_bytes / GIB:.2f} GiB of"
                             f" {self.gpu} = {self.requested_bytes / GIB:.2f} GiB per GPU, but"
                             f" {self.model}'s weights take {self.weight_bytes / GIB:.2f} GiB of it, the largest"
                             f" step's activations {self.activation_bytes / GIB:.2f} GiB and non-torch memory"
                             f" {self.non_torch_bytes / GIB:.2f} GiB (--tp {self.tp}); raise it ({self.utilization:g}"
                             " where no capacity flag is given, vLLM's default), or --tp, or take a smaller model, or"
                             " give the KV capacity itself (--capacity-gib / --capacity-tokens / --capacity-blocks)")
        return self.blocks


def weight_bytes(cost: CostModel, expert_ranks: int = 0) -> float:
    """What loading the model takes on one GPU: its share of the matrices and embeddings, plus what every
    GPU holds whole: the RMSNorm weights (two a layer and the final one) and, on a rotary model, the
    cos/sin cache vLLM builds for the whole window (max_position_embeddings x head_dim in the dtype:
    32 MiB for Llama-3.1's 131,072 positions, which vLLM 0.19.0's 14.99 GiB for Llama-3.1-8B includes).
    ``expert_ranks``: the GPUs a MoE model's experts are split over (expert parallelism: DP x TP,
    shared/expert_parallel.py); 0: over the --tp GPUs, as the rest."""
    m = cost.model
    norms = (2 * m.layers + 1) * m.hidden * m.dtype_bytes
    rope_dim = m.mla.qk_rope_head_dim if m.mla is not None else m.head_dim
    rotary = m.max_context * rope_dim * m.dtype_bytes if m.mlp_matrices == 3 else 0  # OPT: learned positions
    experts = m.routed_params * m.expert_weight_bytes  # MXFP4 or FP8 where the config quantizes them
    # MLA's down projections are whole on every GPU (shared/model_kinds.py), not split
    whole = m.layers * m.mla.replicated_params(m.hidden) * m.layer_weight_bytes if m.mla is not None else 0
    return ((m.weight_bytes - experts) / cost.tp + experts / (expert_ranks or cost.tp) + whole * (1 - 1 / cost.tp)
            + norms + rotary)


def activation_parts(cost: CostModel, tokens: int, rows: int) -> tuple[float, float]:
    """The profiling run's two peaks on one GPU: the forward's working set (``CostModel.activation_bytes``
    without the sampler) and the dummy sampler run's logits work (rows x vocab x 28 bytes, the vocab
    gathered whole on every GPU) beside the forward's output (tokens x hidden in the dtype)."""
    m = cost.model
    forward = cost.activation_bytes(tokens, 0)
    sampler = tokens * m.hidden * m.dtype_bytes + rows * m.vocab * SAMPLER_BYTES_PER_LOGIT
    return forward, sampler


def kv_budget(cost: CostModel, utilization: float, token_budget: int, max_seqs: int, block_size: int,
              terms: tuple[str, ...] = (WEIGHTS, ACTIVATIONS, NON_TORCH), expert_ranks: int = 0) -> KvBudget:
    """vLLM's rule with the terms of a release (``VllmRules.memory_terms``; weights and activations always);
    ``expert_ranks`` as ``weight_bytes``: each DP rank of an expert-parallel group holds its share of experts."""
    if not 0 < utilization <= 1:  # also refuses nan
        raise InputError("--gpu-memory-utilization", f"must be in (0, 1], got {utilization}")
    device, source = cuda_total_bytes(cost.gpu.name, cost.gpu.memory_bytes)
    requested = float(math.ceil(device * utilization))
    weights = weight_bytes(cost, expert_ranks)
    forward, sampler = activation_parts(cost, token_budget, min(max_seqs, token_budget))
    act = max(forward, sampler)
    other = non_torch_bytes(cost.tp) if NON_TORCH in terms else 0.0
    graphs = 0.0  # GRAPH_MEMORY: vLLM's estimate per capture size has no published figure to price it with
    kv_gpu = requested - weights - act - other - graphs
    # vLLM gives each GPU the same count: its KV bytes over one block's page on that GPU, a block of the size
    # vLLM serves the model at (state layers raise it: CostModel.kv_block_size)
    block_size = cost.kv_block_size(block_size)
    blocks = max(0, int(kv_gpu // (cost.block_bytes(block_size) / cost.tp)))
    return KvBudget(utilization, device, cost.tp, weights, act, kv_gpu, blocks, block_size, cost.model.name,
                    cost.gpu.name, other, graphs, requested, source, forward, sampler,
                    tuple(t for t in (WEIGHTS, ACTIVATIONS, NON_TORCH, GRAPH_MEMORY)
                          if t in terms or t in (WEIGHTS, ACTIVATIONS)), groups_note(cost.model.kv_groups, block_size))


def groups_note(groups: KvGroups, block_size: int) -> str:
    """The start line's words on a model of several KV cache groups (empty for one): a block is one group's page,
    and what a request of T tokens holds in each kind of group, vLLM's rules (replica/core/cache/groups.py): every
    block in a full-attention group, at most ``ceil((W - 1) / block_size) + 1`` in a window of W tokens once its
    prefill is computed, one (its running state) in a state group."""
    if not groups.hybrid:
        return ""
    kinds: dict[tuple[str, int], int] = {}
    for x in groups.groups:
        kinds[x.kind, x.window] = kinds.get((x.kind, x.window), 0) + 1
    parts = []
    for (kind, window), n in kinds.items():
        where = "each" if n > 1 else "it"
        if kind == FULL:
            parts.append(f"{n} full (a request of T tokens holds ceil(T/{block_size}) blocks in {where})")
        elif kind == WINDOW:
            most = -(-(window - 1) // block_size) + 1
            parts.append(f"{n} window {window} (a request holds at most {most} blocks in {where} once its prefill"
                         " is computed)")
        else:
            parts.append(f"{n} {kind} (a request holds 1 block in {where}: its state)")
    return (f", each one KV cache group's page of {groups.group_size} layers; {len(groups.groups)} groups: "
            + ", ".join(parts))
