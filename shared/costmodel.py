"""Cost model: KV bytes, capacity in blocks, emulated prefill and decode time.

Shapes. A model is its layer shapes (hidden size, query / KV heads, head size, MLP width,
experts); parameter counts follow from them. An MoE layer computes only its active experts.

Prefill of ``n`` new tokens after ``c`` cached ones, per layer, per GPU (``tp`` splits heads,
MLP and weights; two all-reduces of the activations per layer cross the GPU link):

* linear: ``2 n (attention projections + active MLP)`` FLOPs at ``linear`` x peak, against
  reading the layer's weights (the experts ``n`` tokens touch) at ``memory`` x HBM
  bandwidth: a roofline, whichever is slower;
* attention: ``4 q_heads head_dim (n c + n(n-1)/2)`` FLOPs (every new token over the
  cached prefix and the new tokens before it) at ``attention`` x peak;
* reading the cached prefix's K/V, ``c x 2 q_heads head_dim dtype`` bytes (one copy per
  query head, as attention kernels without GQA sharing read it) at ``kv_read`` x HBM
  bandwidth. Measured on an H200 this read does not overlap the attention's compute, so it
  is added, not maxed: without it a few new tokens over a long prefix come out ~25% fast;
* ``overhead_s`` per layer (launches); decode steps have their own ``decode_overhead_s``.

Decode is memory-bound: weights (the experts the batch touches) at ``memory`` x HBM
bandwidth + the batch's KV at ``decode_kv`` x HBM bandwidth (``memory``'s unless fitted),
or compute-bound (products at ``decode_linear``, ``linear``'s unless fitted) for large
batches, whichever is slower; plus per layer ``decode_overhead_s`` and ``decode_seq_s`` per
sequence (both 0 on the GPU presets: on an H200 the roofline alone held within 6%; a CPU step
pays its products per sequence and reads KV much slower than its weights).

The efficiencies are per model (``Efficiency``; a preset carries its own, a device profile
from ``kvemu calibrate`` replaces them): what each preset was fitted on is its ``source``,
listed in docs/calibration.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from shared.devprofile import is_profile_path, load_profile
from shared.devspecs import Efficiency, GpuSpec
from shared.errors import InputError, UnknownNameError

__all__ = ["Efficiency", "GpuSpec", "ModelSpec", "CostModel", "MODELS", "GPUS", "get_model", "get_gpu"]

GIB = 1024**3


# Fitted on the dense decoder layer stack of llama-3-8b on one H200 (7 prefill points, PyTorch
# SDPA, bf16; docs/calibration.md): mean error 1.2%, max 2.8% on those points; fitted on all
# but one, the left-out point within 3.5% on average, 10.8% at worst (bench/bench_costmodel_fit.py).
DENSE_H200 = Efficiency(0.6432, 0.3415, 0.2162, 0.80, 5.09e-5, 0.0,
                        "llama-3-8b layer stack, 1x H200, PyTorch SDPA (docs/calibration.md)")
# Seed 002 (Qwen3-Coder-30B-A3B on one H200: 8K tokens from scratch 166 ms, after a 64K
# cached prefix 966 ms), measured on a serving stack whose attention reads the prefix at HBM
# speed (kv_read 0.8). Two points, two unknowns (linear, attention): exact on both.
MOE_SEED_002 = Efficiency(0.3871, 0.5427, 0.80, 0.80, 0.0, 0.0,
                          "seed 002: Qwen3-Coder-30B-A3B, 1x H200, 8K prefill at depth 0 and 64K")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    hidden: int
    intermediate: int  # MLP width (MoE: of one expert)
    vocab: int
    experts: int = 0  # 0: dense
    active_experts: int = 0
    dtype_bytes: int = 2
    efficiency: Efficiency | None = None  # None: the dense H200 fit

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def attn_params(self) -> int:
        """Per layer: fused QKV and output projections."""
        return self.hidden * (self.q_heads + 2 * self.kv_heads) * self.head_dim + self.q_heads * self.head_dim * self.hidden

    @property
    def expert_params(self) -> int:
        """One SwiGLU MLP (gate, up, down); the dense MLP when not MoE."""
        return 3 * self.hidden * self.intermediate

    @property
    def router_params(self) -> int:
        return self.hidden * self.experts

    def layer_params(self, experts: float | None = None) -> float:
        """Per layer with ``experts`` experts (default: all of them; dense: the MLP)."""
        if not self.moe:
            return self.attn_params + self.expert_params
        n = self.experts if experts is None else experts
        return self.attn_params + self.router_params + n * self.expert_params

    @property
    def active_params(self) -> float:
        """Parameters touched per token: layers with the active experts, plus the LM head."""
        return self.layers * self.layer_params(self.active_experts or None) + self.vocab * self.hidden

    @property
    def total_params(self) -> float:
        """Resident parameters: every layer and expert, embedding and LM head (untied)."""
        return self.layers * self.layer_params() + 2 * self.vocab * self.hidden

    def touched_experts(self, tokens: int) -> float:
        """Expected distinct experts ``tokens`` tokens route to (uniform routing)."""
        if not self.moe:
            return 0.0
        return self.experts * (1.0 - (1.0 - self.active_experts / self.experts) ** max(tokens, 0))

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.total_params * self.dtype_bytes


_DENSE = {"llama-3-8b": (32, 32, 8, 128, 4096, 14336, 128256), "llama-3-70b": (80, 64, 8, 128, 8192, 28672, 128256),
          "qwen3-8b": (36, 32, 8, 128, 4096, 12288, 151936),
          # The models of seed 001 (FlashGen). Llama 2: published shapes (13B multi-head, 70B GQA).
          "llama-2-13b": (40, 40, 40, 128, 5120, 13824, 32000), "llama-2-70b": (80, 64, 8, 128, 8192, 28672, 32000),
          # OPT: multi-head attention and a two-matrix MLP of width 4 x hidden; given here as the
          # SwiGLU width with the same parameters (2/3 of it), which is all the cost model counts.
          "opt-13b": (40, 40, 40, 128, 5120, 13653, 50272), "opt-30b": (48, 56, 56, 128, 7168, 19115, 50272)}

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        *(ModelSpec(name, *shape, efficiency=DENSE_H200) for name, shape in _DENSE.items()),
        ModelSpec("qwen3-coder-30b-a3b", 48, 32, 4, 128, 2048, 768, 151936, 128, 8, efficiency=MOE_SEED_002),
        # Tiny shapes for CPU tests and `kvemu calibrate --device cpu` (not real models).
        ModelSpec("tiny", 4, 4, 2, 32, 256, 512, 1024),
        ModelSpec("tiny-moe", 4, 4, 2, 32, 256, 256, 1024, 8, 2),
    )
}

GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("a100-80gb", 312e12, 2.039e12, 80e9, 300e9, 25e9),  # PCIe 4: about half the H200's link
        GpuSpec("h100", 989e12, 3.35e12, 80e9),
        GpuSpec("h200", 989e12, 4.8e12, 141e9),
        GpuSpec("ascend-910b2", 376e12, 1.6e12, 64e9, 196e9, 25e9),
    )
}

_ALIASES = {
    "qwen3-coder-30b": "qwen3-coder-30b-a3b",
    "llama3-8b": "llama-3-8b",
    "llama3-70b": "llama-3-70b",
    "a100": "a100-80gb",
    "910b2": "ascend-910b2",
}


def _lookup(table: dict, kind: str, name: str):
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in table:
        raise UnknownNameError(kind, name, list(table))
    return table[key]


def get_model(name: str) -> ModelSpec:
    return _lookup(MODELS, "model", name)


def get_gpu(name: str) -> GpuSpec:
    return _lookup(GPUS, "gpu", name)


def split_tp(spec: str) -> tuple[str, int]:
    """``"h200@tp2"`` -> ("h200", 2): how ``--tp`` travels inside the gpu setting."""
    base, sep, tp = spec.rpartition("@tp")
    if not sep:
        return spec, 1
    if not tp.isdigit() or int(tp) < 1:
        raise InputError("tp", f"must be an integer >= 1, got {tp!r}")
    return base, int(tp)


@dataclass(frozen=True, slots=True)
class PrefillParts:
    """Seconds of one prefill call, summed over the layers (see the module docstring)."""

    linear: float
    weights: float
    attention: float
    kv_read: float
    comm: float
    overhead: float

    @property
    def total(self) -> float:
        return max(self.linear, self.weights) + self.attention + self.kv_read + self.comm + self.overhead


@dataclass(frozen=True, slots=True)
class CostModel:
    model: ModelSpec
    gpu: GpuSpec
    eff: Efficiency | None = None  # None: the model's own, else the dense H200 fit
    tp: int = 1
    # prefill_parts' terms per unit (per token, per attention pair, ...), for the fast path
    _unit: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _decode_unit: tuple[float, ...] = field(init=False, repr=False, compare=False)
    # MoE: expected distinct experts per token count, a power per call otherwise (the simulator
    # prices hundreds of thousands of steps over a few thousand distinct counts)
    _experts: dict[int, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.tp, int) or self.tp < 1:
            raise InputError("tp", f"must be an integer >= 1, got {self.tp!r}")
        one = self.prefill_parts(1, 1)  # linear, attention and prefix read are linear in n, pairs, c
        m = self.model
        bw = self.gpu.hbm_bandwidth * self.tp * self.efficiency.memory
        base = m.layers * m.layer_params(0 if m.moe else None) * m.dtype_bytes / bw  # all but the experts
        per_expert = m.layers * m.expert_params * m.dtype_bytes / bw if m.moe else 0.0
        object.__setattr__(self, "_unit", (one.linear, one.attention, one.kv_read, one.comm, one.overhead, base, per_expert))
        object.__setattr__(self, "_decode_unit", self._decode_units())
        object.__setattr__(self, "_experts", {})

    @classmethod
    def from_names(cls, model: str = "qwen3-coder-30b-a3b", gpu: str = "h200", **kw) -> CostModel:
        """``gpu`` is a preset name or a device profile file from ``kvemu calibrate`` (JSON),
        optionally with ``@tpN``."""
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

    @property
    def mbu_decode(self) -> float:
        return self.efficiency.memory

    # ---- capacity -------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        return self.model.kv_bytes_per_token

    def block_bytes(self, block_size: int) -> int:
        return self.kv_bytes_per_token * block_size

    def gib_to_blocks(self, gib: float, block_size: int) -> int:
        if not 0 <= gib < float("inf"):  # also refuses nan
            raise InputError("capacity_gib", f"must be a finite number >= 0, got {gib}")
        return int(gib * GIB // self.block_bytes(block_size))

    def blocks_to_gib(self, blocks: int, block_size: int) -> float:
        return blocks * self.block_bytes(block_size) / GIB

    # ---- prefill --------------------------------------------------------------
    def prefill_flops(self, new_tokens: int, cached_depth: int = 0) -> tuple[float, float]:
        """(linear, attention) FLOPs over all layers (all GPUs) to prefill ``new_tokens``
        after ``cached_depth`` tokens."""
        if new_tokens < 0 or cached_depth < 0:
            raise InputError("new_tokens", "token counts must be >= 0")
        m = self.model
        linear = 2.0 * new_tokens * m.layer_params(m.active_experts or None) * m.layers
        pairs = new_tokens * cached_depth + new_tokens * (new_tokens - 1) / 2
        return linear, 4.0 * m.q_heads * m.head_dim * m.layers * pairs

    def prefill_parts(self, new_tokens: int, cached_depth: int = 0) -> PrefillParts:
        if new_tokens < 0 or cached_depth < 0:
            raise InputError("new_tokens", "token counts must be >= 0")
        m, e, g, tp = self.model, self.efficiency, self.gpu, self.tp
        n, c, L = new_tokens, cached_depth, m.layers
        peak, bw = g.peak_flops * tp, g.hbm_bandwidth * tp  # the work splits over tp GPUs
        attn_unit = 4.0 * m.q_heads * m.head_dim * L
        weights = L * m.layer_params(m.touched_experts(n) if m.moe else None) * m.dtype_bytes
        comm = 0.0
        if tp > 1:  # two ring all-reduces of the activations per layer
            comm = L * 2 * 2 * (tp - 1) / tp * n * m.hidden * m.dtype_bytes / g.link_bandwidth
        return PrefillParts(
            linear=2.0 * n * L * m.layer_params(m.active_experts or None) / (peak * e.linear),
            weights=weights / (bw * e.memory),
            attention=attn_unit * (n * c + n * (n - 1) / 2) / (peak * e.attention),
            kv_read=L * c * 2 * m.q_heads * m.head_dim * m.dtype_bytes / (bw * e.kv_read),
            comm=comm, overhead=L * e.overhead_s)

    def prefill_time(self, new_tokens: int, cached_depth: int = 0) -> float:
        """``prefill_parts(...).total``, without building the parts (the simulator's hot path)."""
        if new_tokens <= 0 or cached_depth < 0:
            if new_tokens == 0:
                return 0.0
            raise InputError("new_tokens", "token counts must be >= 0")
        n, c = new_tokens, cached_depth
        lin, att, kv, comm, overhead, base, per_expert = self._unit
        weights = base + per_expert * self._touched_experts(n) if per_expert else base
        return max(n * lin, weights) + (n * c + n * (n - 1) / 2) * att + c * kv + n * comm + overhead

    def _touched_experts(self, tokens: int) -> float:
        """``model.touched_experts``, remembered per token count (bounded)."""
        known = self._experts
        e = known.get(tokens)
        if e is None:
            if len(known) >= 1 << 16:
                known.clear()
            e = known[tokens] = self.model.touched_experts(tokens)
        return e

    def block_cost(self, block_index: int, block_size: int) -> float:
        """Emulated seconds to recompute block ``block_index`` (depth = index * block_size):
        its share of a long prefill's compute (linear part compute-bound, attention over
        the block's own tokens and the prefix before it), without per-call costs."""
        p = self.prefill_parts(block_size, block_index * block_size)
        return p.linear + p.attention

    # ---- host <-> device -----------------------------------------------------------
    def host_copy_time(self, blocks: int, block_size: int, copies: int | None = None) -> float:
        """Seconds to copy ``blocks`` KV blocks between pinned host memory and the device (one
        direction) in ``copies`` copy calls (default: one per block, as scattered blocks are)."""
        g = self.gpu
        calls = blocks if copies is None else copies
        return blocks * self.block_bytes(block_size) / (g.host_bandwidth * self.tp) + calls * g.host_copy_overhead_s

    # ---- decode ---------------------------------------------------------------
    def decode_step_time(self, batch_size: int, kv_tokens: int) -> float:
        """One decode step for ``batch_size`` sequences holding ``kv_tokens`` tokens in all."""
        if batch_size <= 0:
            return 0.0
        weights, per_expert, kv, lin, att, per_seq, overhead = self._decode_unit
        if per_expert:  # MoE: experts no sequence in the batch routes to are not read
            weights -= (self.model.experts - self._touched_experts(batch_size)) * per_expert
        return max(weights + kv_tokens * kv, batch_size * lin + kv_tokens * att) + batch_size * per_seq + overhead

    def decode_compute_time(self, batch_size: int, kv_tokens: int) -> float:
        """The compute side of a decode step's roofline: products and attention."""
        lin, att = self._decode_unit[3:5]
        return batch_size * lin + kv_tokens * att

    def decode_weights_time(self, batch_size: int) -> float:
        """The weight read of one decode step (the experts ``batch_size`` sequences touch)."""
        weights, per_expert = self._decode_unit[:2]
        if per_expert:
            weights -= (self.model.experts - self._touched_experts(batch_size)) * per_expert
        return weights

    def _decode_units(self) -> tuple[float, ...]:
        """Seconds of a decode step per unit: (all weights, one expert's weights, per KV token
        read, per sequence's products, per KV token attended, per sequence's all-reduces and
        fixed costs, overhead)."""
        m, e, g, tp = self.model, self.efficiency, self.gpu, self.tp
        bw, peak = g.hbm_bandwidth * tp * e.memory, g.peak_flops * tp
        comm = m.layers * 2 * 2 * (tp - 1) / tp * m.hidden * m.dtype_bytes / g.link_bandwidth if tp > 1 else 0.0
        return (m.weight_bytes / bw, m.layers * m.expert_params * m.dtype_bytes / bw if m.moe else 0.0,
                self.kv_bytes_per_token / (g.hbm_bandwidth * tp * e.decode_kv_eff),
                self.prefill_flops(1, 0)[0] / (peak * e.decode_linear_eff), 4.0 * m.q_heads * m.head_dim * m.layers / (peak * e.attention),
                comm + m.layers * e.decode_seq_s, m.layers * e.decode_overhead_s)
