"""The drafter's seconds a speculative decoding step adds to its verify forward (docs/speculative.md).

The verify forward itself is the step's one forward (``CostModel.step_time``): each decoding sequence has
``1 + d`` query tokens, its sampled token and ``d`` drafts (``StepWork.draft_tokens``), each priced as a
decode token (its products and its LM head row), and the drafts' attention over the sequence's context
(``StepWork.draft_kv``); the context's KV is read once a sequence, as a decode step reads it.

After the forward the drafter proposes the next step's ``K`` drafts for the ``B`` sequences that will decode:

* ``ngram`` (prompt lookup) runs on the CPU over each sequence's tokens: ``NGRAM_S_PER_TOKEN`` a context
  token, measured in vLLM's pull request 56732 (batch-parallel n-gram proposer, 8 threads: 9.95 ms a step
  for 512 sequences of 129,536 tokens, 66.3M tokens scanned). It sits on the step's critical path.
* ``eagle``: a one-layer draft model run ``K`` times at batch ``B``, each pass one decode step of one dense
  layer with the target's attention shape and hidden size and a dense MLP of the target's dense width
  (``dense_intermediate``, else ``intermediate``: an EAGLE head's width is its own config's; this is an
  estimate), its own KV over the context (one layer's), and the target's LM head (EAGLE reuses it).
* ``mtp``: the model's MTP module (DeepSeek-V3's ``num_nextn_predict_layers = 1``) run ``K`` times: one of
  the target's own layers, MoE included (the fused-MoE layer at ``B`` tokens), and the shared LM head.

A pass is priced as the cost model prices a decode step: the larger of its weight and KV reads and its
products (the roofline), plus one layer's share of the graph-replay overhead and ``decode_seq_s`` per
sequence; over ``--tp`` the work splits as the target's does (the draft's all-reduces are left out).
"""

from __future__ import annotations

from shared import model_kinds as kinds
from shared.costmodel import CostModel

# vLLM PR 56732's microbenchmark: 9.95 ms for 512 x 129,536 context tokens (8 proposer threads)
NGRAM_S_PER_TOKEN = 9.95e-3 / (512 * 129_536)


def draft_seconds(cost: CostModel, method: str, k: int, seqs: int, kv_tokens: int) -> float:
    """Seconds the drafter of ``method`` takes to propose ``k`` drafts for ``seqs`` sequences holding
    ``kv_tokens`` context tokens in all."""
    if seqs <= 0 or k <= 0:
        return 0.0
    if method == "ngram":
        return kv_tokens * NGRAM_S_PER_TOKEN
    return k * draft_pass_seconds(cost, seqs, kv_tokens, own_layer=method == "mtp")


def draft_pass_seconds(cost: CostModel, seqs: int, kv_tokens: int, own_layer: bool) -> float:
    """One pass of a one-layer drafter over ``seqs`` tokens (one a sequence): the target's own layer
    (``own_layer``: MTP) or a dense EAGLE layer."""
    m, e, g, tp = cost.model, cost.efficiency, cost.gpu, cost.tp
    peak, hbm = g.peak_flops * tp, g.hbm_bandwidth * tp
    if own_layer:
        layer = m.stack_params(0 if m.moe else None) / m.layers  # attention (and router, shared experts)
    else:
        width = m.dense_intermediate or m.intermediate
        layer = m.attn_params + m.mlp_matrices * m.hidden * width
    kv_per_token = cost.kv_bytes_per_token / m.attention_layers * kinds.kv_copies(m, tp)  # one attention layer's
    memory = ((layer * m.layer_weight_bytes + m.head_params * m.dtype_bytes) / (hbm * e.memory)
              + kv_tokens * kv_per_token / (hbm * e.decode_kv_eff))
    compute = (2.0 * layer * seqs / (peak * e.decode_linear_eff) + 2.0 * m.head_params * seqs / (peak * e.linear)
               + kinds.pair_flops(m, decode=True) * kv_tokens / (peak * e.attention))
    moe = cost.moe_layer_s(seqs / tp, m.touched_experts(seqs) / tp) if own_layer and m.moe else 0.0
    return max(memory, compute) + moe + e.decode_overhead_s + seqs * e.decode_seq_s
