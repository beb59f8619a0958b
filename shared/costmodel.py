"""Cost model: KV bytes, capacity in blocks, emulated prefill and decode time.

Prefill FLOPs of a token at depth ``p`` = linear part ``2 * active_params`` (projections,
MLP, independent of p) + attention ``4 * q_heads * head_dim * layers * p`` (QK^T and AV,
multiply-add counted as 2).  Time = linear FLOPs / (peak * mfu_linear) + attention FLOPs /
(peak * mfu_attention).  The two efficiencies are calibrated on seed 002's measurement
(Qwen3-Coder-30B-A3B, one H200: 8K new tokens from scratch 166 ms, the same 8K after a
64K cached prefix 966 ms).  Decode is memory-bound: weights + KV read per step over HBM
bandwidth, or compute-bound for large batches, whichever is slower.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared.errors import InputError, UnknownNameError

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    layers: int
    q_heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    active_params: float  # parameters touched per token (MoE: active experts only)
    total_params: float  # parameters resident in HBM (read once per decode step)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        return self.total_params * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class GpuSpec:
    name: str
    peak_flops: float  # dense bf16/fp16 FLOP/s
    hbm_bandwidth: float  # bytes/s
    memory_bytes: float


MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("llama-3-8b", 32, 32, 8, 128, 2, 8.03e9, 8.03e9),
        ModelSpec("llama-3-70b", 80, 64, 8, 128, 2, 70.6e9, 70.6e9),
        ModelSpec("qwen3-8b", 36, 32, 8, 128, 2, 8.19e9, 8.19e9),
        ModelSpec("qwen3-coder-30b-a3b", 48, 32, 4, 128, 2, 3.3e9, 30.5e9),
    )
}

GPUS: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        GpuSpec("a100-80gb", 312e12, 2.039e12, 80e9),
        GpuSpec("h100", 989e12, 3.35e12, 80e9),
        GpuSpec("h200", 989e12, 4.8e12, 141e9),
        GpuSpec("ascend-910b2", 376e12, 1.6e12, 64e9),
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


def _attention_depth_sum(start: int, count: int) -> float:
    """Sum of depths p over positions start .. start+count-1 (each attends to p keys)."""
    return count * start + count * (count - 1) / 2


@dataclass(frozen=True, slots=True)
class CostModel:
    model: ModelSpec
    gpu: GpuSpec
    mfu_linear: float = 0.47
    mfu_attention: float = 0.53
    mbu_decode: float = 0.80
    step_overhead_s: float = 0.0

    @classmethod
    def from_names(cls, model: str = "qwen3-coder-30b-a3b", gpu: str = "h200", **kw) -> CostModel:
        return cls(get_model(model), get_gpu(gpu), **kw)

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
        """(linear, attention) FLOPs to prefill ``new_tokens`` after ``cached_depth`` tokens."""
        if new_tokens < 0 or cached_depth < 0:
            raise InputError("new_tokens", "token counts must be >= 0")
        m = self.model
        linear = 2.0 * m.active_params * new_tokens
        attn = 4.0 * m.q_heads * m.head_dim * m.layers * _attention_depth_sum(cached_depth, new_tokens)
        return linear, attn

    def prefill_time(self, new_tokens: int, cached_depth: int = 0) -> float:
        if new_tokens == 0:
            return 0.0
        linear, attn = self.prefill_flops(new_tokens, cached_depth)
        peak = self.gpu.peak_flops
        return linear / (peak * self.mfu_linear) + attn / (peak * self.mfu_attention) + self.step_overhead_s

    def block_cost(self, block_index: int, block_size: int) -> float:
        """Emulated seconds to recompute block ``block_index`` (depth = index * block_size)."""
        linear, attn = self.prefill_flops(block_size, block_index * block_size)
        peak = self.gpu.peak_flops
        return linear / (peak * self.mfu_linear) + attn / (peak * self.mfu_attention)

    # ---- decode ---------------------------------------------------------------
    def decode_step_time(self, batch_size: int, kv_tokens: int) -> float:
        """One decode step for ``batch_size`` sequences holding ``kv_tokens`` tokens in all."""
        if batch_size <= 0:
            return 0.0
        bytes_read = self.model.weight_bytes + kv_tokens * self.kv_bytes_per_token
        mem_time = bytes_read / (self.gpu.hbm_bandwidth * self.mbu_decode)
        linear, attn = self.prefill_flops(batch_size, 0)
        attn = 4.0 * self.model.q_heads * self.model.head_dim * self.model.layers * kv_tokens
        compute_time = linear / (self.gpu.peak_flops * self.mfu_linear) + attn / (
            self.gpu.peak_flops * self.mfu_attention
        )
        return max(mem_time, compute_time) + self.step_overhead_s
