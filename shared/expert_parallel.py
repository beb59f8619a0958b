"""Expert parallelism (vLLM's ``--enable-expert-parallel``) priced on top of the cost model.

With ``--data-parallel-size D`` and ``--tp T`` a MoE model's experts are split over ``EP = D x T`` GPUs
(each holds ``experts / EP`` of every MoE layer) while attention stays replicated per DP rank and split by
TP. Each DP rank runs its own batch of ``t_r`` tokens; in every MoE layer the ranks send each token to the
ranks that hold its ``top-k`` experts (dispatch) and take the results back (combine), so the ranks step in
lockstep. One rank's step, per DP rank (a ``--tp`` group of T GPUs, as the cost model prices a replica):

* everything but the experts is the cost model's step over the rank's own tokens (attention, dense
  projections, LM head, KV reads, the --tp all-reduces, fixed costs);
* its MoE layers (``CostModel.moe_layer_s``, the fused-MoE kernel as measured: shared/moe_cost.py) on
  each of its GPUs at the GPU's share of the group: the ``experts / EP`` local experts that the whole
  group's ``t_g = sum t_r`` tokens touch, ``touched(t_g) / EP`` (``ModelSpec.touched_experts``: uniform
  routing), and ``t_g x top-k / EP`` token-expert products, ``t_g / EP`` tokens' worth, in place of the
  step's own ``touched(t_r) / T`` and ``t_r / T`` (equal products when the ranks are balanced).

The group's step is the slowest rank's plus the all-to-alls as vLLM's default backend runs them
(``allgather_reducescatter``): per MoE layer a dispatch, an all-gather of every DP rank's hidden states
(``t x hidden x dtype`` bytes a rank, the largest rank's ``t``: each ring step waits on its share), and a
combine, a reduce-scatter of the same size, each priced by ``shared.collectives.all_gather_seconds`` on the GPU's link (NCCL's ring:
per-call latency, then ``(D - 1) x t x hidden x dtype`` over the link's bus bandwidth). The bytes do not
scale with top-k: every token goes to every rank, which runs its local experts over all of them. DeepEP's
and pplx's dispatch (a token sent once to each rank holding one of its experts) is not modelled. An idle
rank runs vLLM's dummy batch (``execute_dummy_batch``: one token) so that its experts and collectives take
part (``DUMMY_WORK``).

Left out: expert load imbalance (routing is taken as uniform), the EPLB redundant experts, DeepEP's and
pplx's kernels (their latencies differ from NCCL's), overlap of the all-to-all with computation (vLLM's
dual-batch overlap). Dense layers of a MoE model (DeepSeek's first ones) run no MoE kernel and no collective.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shared.collectives import all_gather_seconds
from shared.costmodel import CostModel, ModelSpec, StepWork
from shared.errors import InputError

# vLLM's dummy batch on an idle DP rank: one decode token (``_dummy_run(1)``), here over one KV token
DUMMY_WORK = StepWork(decoders=1, decode_kv=1)
DISPATCH_AND_COMBINE = 2  # all-to-alls per MoE layer


def check_expert_parallel(model: ModelSpec, enabled: bool, data_parallel_size: int,
                          field: str = "--enable-expert-parallel") -> None:
    """Expert parallelism needs experts and DP ranks to split them over; else it is a flag that would do nothing."""
    if not enabled:
        return
    if not model.moe:
        raise InputError(field, f"{model.name} is dense (no experts to split): a flag that would do nothing; drop it")
    if data_parallel_size < 2:
        raise InputError(field, "kvemu splits experts over DP ranks: give --data-parallel-size 2 or more (over --tp"
                                " alone it is a flag that would do nothing here)")


def expert_bytes(model: ModelSpec) -> float:
    """Every MoE layer's routed experts, in bytes as loaded (FP8 or MXFP4 where quantized; 0 for a dense model)."""
    return float(model.routed_params * model.expert_weight_bytes)


@dataclass(frozen=True, slots=True)
class ExpertParallel:
    """The pricing of one DP group's lockstep step: ``dp`` ranks, each priced by ``cost`` (its --tp group)."""

    cost: CostModel
    dp: int

    @property
    def ep(self) -> int:
        """GPUs the experts are split over: DP x TP."""
        return self.dp * self.cost.tp

    def rank_step_s(self, work: StepWork, group_tokens: int) -> float:
        """One rank's step over its ``work`` while the whole group computes ``group_tokens`` tokens."""
        parts = self.cost.step_parts(work)
        m, ep = self.cost.model, self.ep
        if not m.moe or work.tokens <= 0:
            return parts.total
        moe = m.moe_layers * self.cost.moe_layer_s(group_tokens / ep, m.touched_experts(group_tokens) / ep)
        return replace(parts, moe=moe).total

    def dummy_step_s(self, group_tokens: int) -> float:
        """An idle rank's dummy batch (``DUMMY_WORK``)."""
        return self.rank_step_s(DUMMY_WORK, group_tokens)

    def all_to_all_s(self, max_rank_tokens: int) -> float:
        """A step's dispatches and combines over every MoE layer: all-gathers and reduce-scatters over the DP
        ranks of the largest rank's tokens' hidden states."""
        m = self.cost.model
        rank_bytes = max_rank_tokens * m.hidden * m.dtype_bytes
        return DISPATCH_AND_COMBINE * m.moe_layers * all_gather_seconds(self.cost.link, self.dp, rank_bytes)
