"""Cost model: KV bytes, capacity in blocks, and the GPU time of one scheduler step.

A step is ONE forward over every token it schedules (vLLM v1: chunked prefill and decode in
one batch). Its inputs (``StepWork``) are its prefill chunks (``n_i`` new tokens after ``c_i``
cached ones) and its decoders (``B`` sequences attending ``K`` KV tokens in all); ``T = sum n_i
+ B`` tokens. Over the layers, per GPU (``tp`` splits heads, MLP and weights):

* weights, read once: every layer's (MoE: but the routed experts) and the LM head, at ``memory`` x HBM
  bandwidth; plus the decoders' KV, ``K x kv_bytes_per_token`` at ``decode_kv`` x HBM bandwidth;
* products over all ``T`` tokens: ``2 x (attention projections + MLP)`` FLOPs a token (MoE: no routed expert)
  (prefill tokens at ``linear`` x peak, decode tokens at ``decode_linear``), the LM head once
  a sequence, and the decoders' attention ``4 q_heads head_dim K`` FLOPs at ``attention`` x
  peak. The step takes whichever of the two is slower (a roofline);
* MoE layers, kernels of their own: the fused-MoE layer as measured (shared/moe_cost.py) at the step's
  ``T`` tokens and the experts they touch, over ``tp`` (each GPU a slice of every expert);
* per prefill sequence, outside the roofline: its attention ``4 q_heads head_dim (n c +
  n(n-1)/2)`` FLOPs at ``attention`` x peak, and its cached prefix's K/V read, ``c x 2 q_heads
  head_dim dtype`` bytes (one copy per query head, as attention kernels without GQA sharing
  read it) at ``kv_read`` x HBM bandwidth (on an H200 this read did not overlap the
  attention's compute: without it a few new tokens over a long prefix come out ~25% fast);
* the attention terms per kind of layer (shared/model_kinds.py, ``layer_counts``): the above over the full-attention
  layers; a sliding-window layer's with each context cut to its window ``W`` (a decoder reads ``min(K_i, W)``
  tokens, a chunk's query at position ``p`` attends ``min(p, W)`` keys and reads ``min(c_i, W)`` cached ones:
  ``StepWork``'s window fields); a state layer's as each sequence's state read and written once a step (decoders on
  the memory side, chunks beside the attention) and its products linear in the tokens, at ``attention`` x peak;
* tensor parallelism: two all-reduces a layer (after the attention's output projection and the MLP's down
  projection, MoE layers alike) and one after the input embedding, each of the step's ``T x hidden``
  activations in the dtype, priced as NCCL picks and runs it on the GPUs' link (shared/collectives.py:
  a per-call latency, then the link's measured bus bandwidth);
* fixed costs once per step: ``overhead_s`` per layer when the step runs eagerly,
  ``decode_overhead_s`` when it replays a captured CUDA graph (a decode-only step, or any step
  of at most ``graph_tokens`` tokens); ``decode_seq_s`` per layer and decoder (a CPU pays
  products per sequence).

One prefill alone is this step with one chunk; a decode step, the step with no chunk: the two
forms fitted on measurements (docs/calibration.md) are the two ends of this one. The H200
prefill points are all compute-bound (1,024 tokens and more) and no decode or mixed step has
been measured on a GPU here. Vidur's A100 operator profiles show the corner between weight-bound
and compute-bound softer than a ``max`` (at 128 tokens the ``max`` is up to 31% under Vidur's time,
bench/bench_costmodel_vidur.py); no H200 point measures it, so it stays the roofline's ``max``.

The efficiencies are per model (``Efficiency``; a preset carries its own, a device profile
from ``kvemu calibrate`` replaces them): what each preset was fitted on is its ``source``,
listed in docs/calibration.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from shared import memory_rule
from shared import model_kinds as kinds
from shared.collectives import LinkModel, all_reduce_seconds, link_of
from shared.devprofile import is_profile_path, load_profile
from shared.devspecs import Efficiency, GpuSpec
from shared.errors import InputError
from shared.gpu_presets import get_gpu, split_tp
from shared.kv_groups import state_block_size
from shared.memory_rule import KvBudget
from shared.model_presets import DENSE_H200, get_model
from shared.model_spec import ModelSpec
from shared.moe_cost import MoeKernel

# the cost model's vocabulary, where most callers import it from: the shapes (shared/model_spec.py), the presets'
# lookups (shared/model_presets.py, shared/gpu_presets.py) and the device's rates (shared/devspecs.py)
__all__ = ["Efficiency", "GpuSpec", "ModelSpec", "CostModel", "KvBudget", "StepWork", "StepParts", "layered_finish",
           "get_model", "get_gpu", "split_tp"]

GIB = 1024**3


class StepWork(NamedTuple):
    """What one step computes, summed over its sequences (``of`` builds it from the chunks)."""

    prefill_tokens: int = 0  # new tokens of the prefill chunks, sum n_i
    prefill_seqs: int = 0  # prefill chunks (one per sequence)
    attn_pairs: float = 0.0  # sum n_i c_i + n_i (n_i - 1) / 2: query-key pairs of the chunks
    cached_tokens: int = 0  # sum c_i: prefix tokens the chunks read
    decoders: int = 0  # sequences decoding one token
    decode_kv: int = 0  # KV tokens the decoders attend, in all
    # speculative decoding's verify forward: the decoders' draft tokens, queries beside their sampled one (each
    # a decode token's products and LM head row), and sum d_i K_i, the KV tokens those queries attend (the KV
    # is read once a sequence: decode_kv; shared/spec_cost.py)
    draft_tokens: int = 0
    draft_kv: int = 0
    # sliding-window layers (a model's window W, ``CostModel.window``): what they attend, each context cut to W:
    # sum over the chunks of sum_j min(c_i + j, W) (``window_pairs``), sum min(c_i, W), sum over the decoders of
    # min(K_i, W), and sum d_i min(K_i, W). -1: not given, bounded from the sums above (min(pairs, n W), ...: exact
    # where every context reaches the window, or none does)
    window_pairs: float = -1.0
    window_cached: int = -1
    window_kv: int = -1
    window_draft_kv: int = -1

    @classmethod
    def of(cls, chunks: Iterable[tuple[int, int]] = (), decoders: int = 0, decode_kv: int = 0, window: int = 0,
           window_kv: int = -1) -> StepWork:
        """``chunks``: (new tokens, cached depth) per prefill sequence; ``window``: the model's window, whose
        figures the chunks give exactly (0: none)."""
        tokens = seqs = cached = w_cached = 0
        pairs = w_pairs = 0.0
        for n, c in chunks:
            if n < 0 or c < 0:
                raise InputError("new_tokens", "token counts must be >= 0")
            if n:
                tokens += n
                seqs += 1
                cached += c
                pairs += n * c + n * (n - 1) / 2
                if window:
                    w_pairs += kinds.window_pairs(n, c, window)
                    w_cached += min(c, window)
        if decoders < 0 or decode_kv < 0:
            raise InputError("decoders", "decoders and their KV tokens must be >= 0")
        return cls(tokens, seqs, pairs, cached, decoders, decode_kv, window_pairs=w_pairs if window else -1.0,
                   window_cached=w_cached if window else -1, window_kv=window_kv)

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decoders + self.draft_tokens


@dataclass(frozen=True, slots=True)
class StepParts:
    """Seconds of one step by term, summed over the layers (see the module docstring)."""

    weights: float  # layer weights (MoE: but the routed experts) and LM head
    decode_kv: float  # decoders' KV read
    linear: float  # products over the step's tokens (layers only)
    head: float  # the LM head's products, once a sequence
    decode_attention: float
    attention: float  # the prefill chunks' attention
    kv_read: float  # the prefill chunks' cached prefix read
    comm: float
    overhead: float  # fixed costs of the step and per decoder
    moe: float = 0.0  # the fused-MoE layers, kernels of their own beside the roofline (shared/moe_cost.py)

    @property
    def memory_side(self) -> float:
        return self.weights + self.decode_kv

    @property
    def compute_side(self) -> float:
        return self.linear + self.head + self.decode_attention

    @property
    def total(self) -> float:
        return (max(self.memory_side, self.compute_side) + self.moe + self.attention + self.kv_read + self.comm
                + self.overhead)


class _Units(NamedTuple):
    """Seconds per unit of each term (per token, pair, ...), for the hot path."""

    prefill_linear: float  # per prefill token
    decode_linear: float  # per decode token
    head_read: float  # LM head, once per step
    head_linear: float  # LM head products, per sequence
    base_weights: float  # layer weights but the experts (dense: all of them)
    moe_token: float  # the MoE layers' products a token of a long prefill (0: dense)
    decode_kv: float  # per decode KV token read
    attention: float  # per query-key pair of a prefill chunk
    decode_attention: float  # per decoder's context token (MLA: the absorbed form)
    kv_read: float  # per cached prefix token
    comm_calls: int  # all-reduces a step (0: no --tp)
    comm_bytes: float  # one all-reduce's message per token
    per_decoder: float  # decode_seq_s over the layers
    eager: float  # fixed, eager step
    graphed: float  # fixed, graph replay
    graph_tokens: int


class _Mixed(NamedTuple):
    """Seconds per unit of the window and state layers' terms (shared/model_kinds.py), for the hot path."""

    window: int  # the window, tokens
    window_kv: float  # per window token a decoder reads
    window_decode_attention: float  # ... a decoding query attends
    window_attention: float  # per query-key pair of a chunk inside the window
    window_read: float  # per cached token of a chunk inside the window
    state_decoder: float  # per decoding sequence: its states read and written
    state_decode_token: float  # per decode token: the state layers' products
    state_prefill_token: float  # per prefill token
    state_chunk: float  # per prefill chunk: its states read and written


@dataclass(frozen=True, slots=True)
class CostModel:
    model: ModelSpec
    gpu: GpuSpec
    eff: Efficiency | None = None  # None: the model's own, else the dense H200 fit
    tp: int = 1
    _u: _Units = field(init=False, repr=False, compare=False)
    # MoE: the fused-MoE layer, and a step's MoE layers per token count (a power and a max per call otherwise;
    # the simulator prices hundreds of thousands of steps over a few thousand distinct counts)
    _moe_kernel: MoeKernel | None = field(init=False, repr=False, compare=False)
    _moe: dict[int, float] = field(init=False, repr=False, compare=False)
    # --tp: the link the all-reduces cross, and a step's all-reduce seconds per token count (bounded)
    _link: LinkModel = field(init=False, repr=False, compare=False)
    _comm: dict[int, float] = field(init=False, repr=False, compare=False)
    # window and state layers' units; None for a model of full-attention layers only (its prices as they were)
    _mix: _Mixed | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.tp, int) or self.tp < 1:
            raise InputError("tp", f"must be an integer >= 1, got {self.tp!r}")
        m, e, g = self.model, self.efficiency, self.gpu
        object.__setattr__(self, "_moe_kernel", MoeKernel.of(
            e.moe_floor_s, e.moe_memory_eff, e.moe_linear_eff, e.moe_table, m.expert_params * m.expert_weight_bytes,
            2.0 * m.active_experts * m.expert_params, g.hbm_bandwidth, g.peak_flops) if m.moe else None)
        object.__setattr__(self, "_u", self._units())
        object.__setattr__(self, "_mix", self._mixed_units())
        object.__setattr__(self, "_moe", {})
        object.__setattr__(self, "_link", link_of(self.gpu))
        object.__setattr__(self, "_comm", {})

    @classmethod
    def from_names(cls, model: str = "qwen3-coder-30b-a3b", gpu: str = "h200", **kw) -> CostModel:
        """``model`` is a preset name or a Hugging Face config.json (``get_model``); ``gpu`` a preset name or a
        device profile file from ``kvemu calibrate`` (JSON), optionally with ``@tpN``."""
        gpu, tp = split_tp(gpu)
        kw.setdefault("tp", tp)
        m = get_model(model)
        if is_profile_path(gpu):
            profile = load_profile(gpu)
            kw.setdefault("eff", profile.efficiency_for(m.name))
            return cls(m, profile.gpu, **kw)
        return cls(m, get_gpu(gpu), **kw)

    @property
    def efficiency(self) -> Efficiency:
        return self.eff or self.model.efficiency or DENSE_H200

    def with_efficiency(self, eff: Efficiency) -> CostModel:
        return replace(self, eff=eff)

    # ---- capacity -------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token

    @property
    def kv_bytes_per_gpu_token(self) -> float:
        """A token's KV on each of the --tp GPUs: its share of the KV heads, or all of MLA's latent."""
        return self.kv_bytes_per_token * kinds.kv_copies(self.model, self.tp) / self.tp

    def block_bytes(self, block_size: int) -> int:
        """One block's KV over the replica's GPUs (every copy a --tp group keeps): one KV cache group's page,
        every layer's for a full-attention model (shared/kv_groups.py)."""
        return int(self.model.kv_bytes_per_block_token * kinds.kv_copies(self.model, self.tp)) * block_size

    def kv_block_size(self, block_size: int) -> int:
        """The block size vLLM serves this model at: ``block_size``, raised for state layers until one layer's
        attention page on a rank holds a state's share of that rank (shared/kv_groups.py, ``state_block_size``;
        vLLM shards a state over --tp as it does the KV heads, its conv and recurrent heads divided by the ranks)."""
        m = self.model
        state = m.kv_groups.state_bytes
        if not state:
            return block_size
        token = kinds.kv_values(m) * kinds.kv_element_bytes(m.kv_cache_dtype, m.dtype_bytes)
        return state_block_size(block_size, -(-state // self.tp),
                                -(-int(token * kinds.kv_copies(m, self.tp)) // self.tp))

    def gib_to_blocks(self, gib: float, block_size: int) -> int:
        if not 0 <= gib < float("inf"):  # also refuses nan
            raise InputError("capacity_gib", f"must be a finite number >= 0, got {gib}")
        return int(gib * GIB // self.block_bytes(block_size))

    def blocks_to_gib(self, blocks: int, block_size: int) -> float:
        return blocks * self.block_bytes(block_size) / GIB

    def activation_bytes(self, tokens: int, sampled: int) -> float:
        """Peak activation memory on one GPU of vLLM's profiling run (``profile_run``: one forward of
        ``tokens`` tokens, max_num_batched_tokens, then the sampler over ``sampled`` rows). An estimate
        of the tensors alive at the peak, in the model's dtype: the residual stream and the normed
        hidden states (``2 x hidden`` a token, whole on every GPU), plus the larger working set of one
        layer, split over ``tp`` (attention: the fused QKV output and the attention output; MLP: the
        fused gate/up output and the activation, ``3 x intermediate`` for SwiGLU, ``2 x`` for a
        two-matrix MLP; MoE: vLLM's fused_moe caches for each of the ``active_experts`` a token goes
        to, plus the expert outputs ``hidden`` wide and the router logits in fp32); and the sampled
        rows' logits (the vocab, gathered whole on every GPU: in the dtype, their fp32 copy and the
        fp32 probabilities). Layers run one after another, so one layer's set is alive at a time.
        Left out: non-torch memory (CUDA context, NCCL and cuBLAS workspaces: about 0.5-1 GiB) and
        CUDA-graph memory, which vLLM also subtracts; so this capacity is an upper bound by that much."""
        m, tp, d = self.model, self.tp, self.model.dtype_bytes
        hidden = 2 * m.hidden
        attn = (m.mla.activation_width(m.q_heads) if m.mla is not None
                else (m.q_heads + 2 * m.kv_heads) * m.head_dim + m.q_heads * m.head_dim) / tp
        mlp_width = (3 if m.mlp_matrices == 3 else 2) * m.intermediate / tp
        if m.moe:
            mlp = m.active_experts * (mlp_width + m.hidden) + m.experts * 4 / d
            if m.dense_layers:  # a dense layer's MLP (DeepSeek's first layers) may be the larger set
                mlp = max(mlp, (3 if m.mlp_matrices == 3 else 2) * m.dense_intermediate / tp)
        else:
            mlp = mlp_width
        return tokens * d * (hidden + max(attn, mlp)) + sampled * m.vocab * (d + 8)

    def kv_budget(self, utilization: float, token_budget: int, max_seqs: int, block_size: int) -> KvBudget:
        """vLLM's capacity rule (``--gpu-memory-utilization``), term by term: shared/memory_rule.py."""
        return memory_rule.kv_budget(self, utilization, token_budget, max_seqs, block_size)

    # ---- one step ---------------------------------------------------------------
    def _units(self) -> _Units:
        m, e, g, tp = self.model, self.efficiency, self.gpu, self.tp
        L, peak, hbm = m.layers, g.peak_flops * tp, g.hbm_bandwidth * tp  # the work splits over tp GPUs
        bw = hbm * e.memory
        token_flops = 2.0 * m.stack_params(0 if m.moe else None)  # the routed experts: the MoE layer's own
        kernel = self._moe_kernel
        # MLA's prefill up-projects each cached prefix token's latent (shared/model_kinds.py)
        context_s = L * m.mla.context_flops(m.q_heads) / (peak * e.linear) if m.mla is not None else 0.0
        full = kinds.layer_counts(m).full  # the attention terms below are the full-attention layers' (all: L)
        token_kv = full * kinds.kv_values(m) * kinds.kv_element_bytes(m.kv_cache_dtype, m.dtype_bytes)
        return _Units(
            prefill_linear=token_flops / (peak * e.linear), decode_linear=token_flops / (peak * e.decode_linear_eff),
            head_read=m.head_params * m.dtype_bytes / bw, head_linear=2.0 * m.head_params / (peak * e.linear),
            base_weights=m.stack_params(0 if m.moe else None) * m.layer_weight_bytes / bw,
            moe_token=m.moe_layers * kernel.token_slope_s() / tp if kernel is not None else 0.0,
            decode_kv=token_kv * kinds.kv_copies(m, tp) / (hbm * e.decode_kv_eff),
            attention=kinds.pair_flops(m, decode=False) * full / (peak * e.attention),
            decode_attention=kinds.pair_flops(m, decode=True) * full / (peak * e.attention),
            kv_read=full * kinds.context_read_bytes(m) / (hbm * e.kv_read) + context_s,
            comm_calls=2 * L + 1 if tp > 1 else 0, comm_bytes=float(m.hidden * m.dtype_bytes),
            per_decoder=L * e.decode_seq_s, eager=L * e.overhead_s, graphed=L * e.decode_overhead_s,
            graph_tokens=e.graph_tokens)

    def _mixed_units(self) -> _Mixed | None:
        """The window and state layers' units (shared/model_kinds.py); None where every layer is full attention."""
        m, e, g, tp = self.model, self.efficiency, self.gpu, self.tp
        n = kinds.layer_counts(m)
        if not n.window and not n.state:
            return None
        peak, hbm = g.peak_flops * tp, g.hbm_bandwidth * tp
        token_kv = kinds.kv_values(m) * kinds.kv_element_bytes(m.kv_cache_dtype, m.dtype_bytes) * kinds.kv_copies(m, tp)
        state_values = n.state_bytes / m.dtype_bytes  # vLLM keeps the states in the model's dtype ("auto")
        return _Mixed(
            window=n.window_tokens, window_kv=n.window * token_kv / (hbm * e.decode_kv_eff),
            window_decode_attention=kinds.pair_flops(m, decode=True) * n.window / (peak * e.attention),
            window_attention=kinds.pair_flops(m, decode=False) * n.window / (peak * e.attention),
            window_read=n.window * kinds.context_read_bytes(m) / (hbm * e.kv_read),
            state_decoder=2 * n.state_bytes / (hbm * e.decode_kv_eff),
            state_decode_token=kinds.STATE_DECODE_FLOPS * state_values / (peak * e.attention),
            state_prefill_token=kinds.STATE_PREFILL_FLOPS * state_values / (peak * e.attention),
            state_chunk=2 * n.state_bytes / (hbm * e.kv_read))

    @property
    def window(self) -> int:
        """The model's sliding window, tokens (0: none), what ``StepWork``'s window fields cut contexts to."""
        mix = self._mix
        return mix.window if mix is not None else 0

    def _mixed_s(self, work: StepWork) -> tuple[float, float, float, float]:
        """The window and state layers' seconds of ``work``: (decoders' reads, decoders' products, the chunks'
        attention, the chunks' reads); the window fields not given bounded from the sums (``StepWork``)."""
        x = self._mix
        assert x is not None
        w = x.window
        kv = work.window_kv if work.window_kv >= 0 else min(work.decode_kv, work.decoders * w)
        draft = work.window_draft_kv if work.window_draft_kv >= 0 else min(work.draft_kv, work.draft_tokens * w)
        pairs = work.window_pairs if work.window_pairs >= 0 else min(work.attn_pairs, work.prefill_tokens * w)
        cached = work.window_cached if work.window_cached >= 0 else min(work.cached_tokens, work.prefill_seqs * w)
        return (kv * x.window_kv + work.decoders * x.state_decoder,
                (kv + draft) * x.window_decode_attention + (work.decoders + work.draft_tokens) * x.state_decode_token,
                pairs * x.window_attention + work.prefill_tokens * x.state_prefill_token,
                cached * x.window_read + work.prefill_seqs * x.state_chunk)

    def step_parts(self, work: StepWork) -> StepParts:
        """The step's seconds by term; all zero for a step with no tokens."""
        t = work.tokens
        if t <= 0:
            return StepParts(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        u = self._u
        weights = u.base_weights + u.head_read
        fixed = u.graphed if t <= u.graph_tokens or not work.prefill_seqs else u.eager
        decode_kv, decode_attention = work.decode_kv * u.decode_kv, (work.decode_kv + work.draft_kv) * u.decode_attention
        attention, kv_read = work.attn_pairs * u.attention, work.cached_tokens * u.kv_read
        if self._mix is not None:  # window and state layers
            reads, products, chunks, chunk_reads = self._mixed_s(work)
            decode_kv, decode_attention = decode_kv + reads, decode_attention + products
            attention, kv_read = attention + chunks, kv_read + chunk_reads
        return StepParts(
            weights=weights, decode_kv=decode_kv,
            linear=work.prefill_tokens * u.prefill_linear + (work.decoders + work.draft_tokens) * u.decode_linear,
            head=(work.prefill_seqs + work.decoders + work.draft_tokens) * u.head_linear,
            decode_attention=decode_attention, attention=attention, kv_read=kv_read, comm=self.all_reduce_s(t),
            overhead=fixed + work.decoders * u.per_decoder, moe=self._moe_s(t))

    def step_time(self, work: StepWork) -> float:
        """Seconds of one step: ``step_parts(work).total`` without building the parts (the hot path)."""
        decode_tokens = work.decoders + work.draft_tokens
        t = work.prefill_tokens + decode_tokens
        if t <= 0:
            return 0.0
        u = self._u
        weights = u.base_weights + u.head_read + work.decode_kv * u.decode_kv
        compute = (work.prefill_tokens * u.prefill_linear + decode_tokens * u.decode_linear
                   + (work.prefill_seqs + decode_tokens) * u.head_linear
                   + (work.decode_kv + work.draft_kv) * u.decode_attention)
        fixed = u.graphed if t <= u.graph_tokens or not work.prefill_seqs else u.eager
        if self._mix is None:
            return (max(weights, compute) + self._moe_s(t) + work.attn_pairs * u.attention
                    + work.cached_tokens * u.kv_read + self.all_reduce_s(t) + fixed + work.decoders * u.per_decoder)
        reads, products, chunks, chunk_reads = self._mixed_s(work)  # window and state layers
        return (max(weights + reads, compute + products) + self._moe_s(t) + work.attn_pairs * u.attention
                + work.cached_tokens * u.kv_read + chunks + chunk_reads + self.all_reduce_s(t) + fixed
                + work.decoders * u.per_decoder)

    def all_reduce_s(self, tokens: int) -> float:
        """Seconds of a step's --tp all-reduces over ``tokens`` tokens (0.0 without --tp), remembered per
        token count (bounded)."""
        u = self._u
        if not u.comm_calls or tokens <= 0:
            return 0.0
        s = self._comm.get(tokens)
        if s is None:
            s = _remember(self._comm, tokens, u.comm_calls * all_reduce_seconds(self._link, self.tp, tokens * u.comm_bytes))
        return s

    @property
    def link(self) -> LinkModel:
        """The link a --tp group's all-reduces cross (shared/collectives.py)."""
        return self._link

    def tp_link_per_token(self) -> tuple[float, float]:
        """A step's all-reduces per token at the link's bus bandwidth, without their per-call latency: (seconds,
        bytes each direction over the ``tp`` GPUs' links together; a ring sends 2 (tp-1)/tp of each message).
        What the tier stack shares with host copies on a card whose all-reduce crosses PCIe."""
        u = self._u
        if not u.comm_calls:
            return 0.0, 0.0
        per_gpu = u.comm_calls * 2.0 * (self.tp - 1) / self.tp * u.comm_bytes
        return per_gpu / self._link.bus_bytes_per_s, per_gpu * self.tp

    def moe_layer_s(self, tokens: float, experts: float) -> float:
        """One MoE layer on one GPU over ``tokens`` tokens and ``experts`` whole experts (shared/moe_cost.py: what
        --tp and expert parallelism ask it); 0.0 for a dense model."""
        kernel = self._moe_kernel
        return 0.0 if kernel is None else kernel.seconds(tokens, experts)

    def _moe_s(self, tokens: int) -> float:
        """A step's MoE layers over ``tokens`` tokens and the experts they touch, remembered per count (bounded)."""
        if self._moe_kernel is None:
            return 0.0
        s = self._moe.get(tokens)
        if s is None:
            m, tp = self.model, self.tp
            s = _remember(self._moe, tokens, m.moe_layers * self.moe_layer_s(tokens / tp, m.touched_experts(tokens) / tp))
        return s

    # ---- one request's prefill, one decode step: the step with one chunk / no chunk ----------
    def prefill_flops(self, new_tokens: int, cached_depth: int = 0) -> tuple[float, float]:
        """(linear, attention) FLOPs over all layers (all GPUs) to prefill ``new_tokens``
        after ``cached_depth`` tokens."""
        if new_tokens < 0 or cached_depth < 0:
            raise InputError("new_tokens", "token counts must be >= 0")
        m = self.model
        linear = 2.0 * new_tokens * m.stack_params(m.active_experts or None)
        pairs = new_tokens * cached_depth + new_tokens * (new_tokens - 1) / 2
        n, pair = kinds.layer_counts(m), kinds.pair_flops(m, decode=False)
        attention = pair * n.full * pairs
        if n.window or n.state:  # window layers inside their window, state layers linear in the tokens
            attention += (pair * n.window * kinds.window_pairs(new_tokens, cached_depth, n.window_tokens or 1)
                          + kinds.STATE_PREFILL_FLOPS * n.state_bytes / m.dtype_bytes * new_tokens)
        return linear, attention

    def prefill_parts(self, new_tokens: int, cached_depth: int = 0) -> StepParts:
        return self.step_parts(StepWork.of([(new_tokens, cached_depth)], window=self.window))

    def prefill_time(self, new_tokens: int, cached_depth: int = 0) -> float:
        """One request's prefill as a step of its own."""
        return self.step_time(StepWork.of([(new_tokens, cached_depth)], window=self.window))

    def decode_step_time(self, batch_size: int, kv_tokens: int) -> float:
        """One decode-only step for ``batch_size`` sequences holding ``kv_tokens`` tokens in all."""
        return self.step_time(StepWork(decoders=batch_size, decode_kv=kv_tokens)) if batch_size > 0 else 0.0

    def block_cost(self, block_index: int, block_size: int) -> float:
        """Emulated seconds to recompute block ``block_index`` (depth = index * block_size):
        its share of a long prefill's compute (products compute-bound, attention over
        the block's own tokens and the prefix before it), without per-step costs."""
        p = self.prefill_parts(block_size, block_index * block_size)
        return p.linear + p.attention + block_size * self._u.moe_token


def _remember(known: dict[int, float], tokens: int, seconds: float) -> float:
    """Store ``seconds`` for ``tokens`` in a per-token-count memo, emptied once it holds 65,536 counts so that a
    long run's memory stays bounded."""
    if len(known) >= 1 << 16:
        known.clear()
    known[tokens] = seconds
    return seconds


def layered_finish(compute: float, restores: Iterable[tuple[float, float]], layers: int) -> float:
    """Seconds from the step's start until a forward of ``compute`` seconds ends when some of its
    sequences' KV still arrives from a lower tier, layer by layer (each transfer ``(start,
    ready)``, seconds from the step's start, delivers its layers evenly over that span). Layer
    ``l`` of the forward waits for layer ``l`` of every transfer; with layers of equal cost the
    latest start is that of the first layer or the last: ``max(compute, start + (ready - start)
    / L + compute, ready + compute / L)``. A transfer whose first layer is in before the step and
    whose last is in with a layer of compute to spare adds nothing."""
    finish = compute
    per_layer = compute / layers
    for start, ready in restores:
        if ready <= 0.0:
            continue
        finish = max(finish, start + (ready - start) / layers + compute, ready + per_layer)
    return finish
