"""A model's decoder layer stack in torch, with random weights: what `kvemu calibrate` times
and what `replica --backend torch` runs.

Each layer: RMSNorm, fused QKV projection, rotary positions, grouped-query attention through
``scaled_dot_product_attention`` (a lower-right causal mask over the cached prefix), output
projection, RMSNorm, SwiGLU MLP, or for an MoE model a router and the top-k experts, of which
only the experts some token routes to are computed. Weights come from a seeded generator, so
two stacks built with the same seed compute the same values: K/V are a deterministic function
of the token chain (on one device: a GPU's generator draws other numbers than the CPU's).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from shared.costmodel import ModelSpec


def pick_dtype(device: str) -> torch.dtype:
    """bf16 on a GPU (what serving runs); float32 on the CPU (its bf16 products are slow)."""
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


@dataclass(slots=True)
class LayerWeights:
    norm1: torch.Tensor
    wqkv: torch.Tensor  # [hidden, (q + 2 kv) head_dim]
    wo: torch.Tensor  # [q head_dim, hidden]
    norm2: torch.Tensor
    gate_up: torch.Tensor  # dense [hidden, 2 inter]; MoE [experts, hidden, 2 inter]
    down: torch.Tensor  # dense [inter, hidden]; MoE [experts, inter, hidden]
    router: torch.Tensor | None  # MoE [hidden, experts]


class TorchStack:
    """``layers`` layers of ``spec`` (default: all) on ``device``."""

    def __init__(self, spec: ModelSpec, device: str = "cpu", layers: int | None = None, seed: int = 0,
                 dtype: torch.dtype | None = None) -> None:
        self.spec, self.device = spec, torch.device(device)
        self.dtype = dtype or pick_dtype(device)
        self.n_layers = layers or spec.layers
        gen = torch.Generator(device=self.device).manual_seed(seed)  # on the device: 8B weights in seconds
        self.embed = self._rand(gen, (spec.vocab, spec.hidden), 1.0)
        self.layers = [self._layer(gen) for _ in range(self.n_layers)]
        half = spec.head_dim // 2
        self.inv_freq = (1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32) / half))).to(self.device)

    def _rand(self, gen: torch.Generator, shape: tuple[int, ...], scale: float) -> torch.Tensor:
        return (torch.randn(shape, generator=gen, device=self.device) * scale).to(self.dtype)

    def _layer(self, gen: torch.Generator) -> LayerWeights:
        s = self.spec
        h, qkv = s.hidden, (s.q_heads + 2 * s.kv_heads) * s.head_dim
        experts = (s.experts,) if s.moe else ()
        ones = torch.ones(h, device=self.device, dtype=self.dtype)
        return LayerWeights(
            ones, self._rand(gen, (h, qkv), h ** -0.5), self._rand(gen, (s.q_heads * s.head_dim, h), (s.q_heads * s.head_dim) ** -0.5),
            ones.clone(), self._rand(gen, (*experts, h, 2 * s.intermediate), h ** -0.5),
            self._rand(gen, (*experts, s.intermediate, h), s.intermediate ** -0.5),
            self._rand(gen, (h, s.experts), h ** -0.5) if s.moe else None)

    # ---- pieces ---------------------------------------------------------------
    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed[tokens.to(self.device) % self.spec.vocab]

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Rotary embedding of x [tokens, heads, head_dim] at ``positions`` [tokens]."""
        ang = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        cos, sin = ang.cos()[:, None, :].to(x.dtype), ang.sin()[:, None, :].to(x.dtype)
        a, b = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)

    def _mlp(self, w: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        if w.router is None:
            gate, up = (x @ w.gate_up).chunk(2, dim=-1)
            return (F.silu(gate) * up) @ w.down
        k = self.spec.active_experts
        weights, chosen = torch.topk(torch.softmax((x @ w.router).float(), dim=-1), k, dim=-1)
        weights = (weights / weights.sum(-1, keepdim=True)).to(x.dtype)
        out = torch.zeros_like(x)
        flat = chosen.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.spec.experts).tolist()
        token_of = order // k
        start = 0
        for e, count in enumerate(counts):  # only the experts some token routes to
            if count == 0:
                continue
            idx = token_of[start:start + count]
            gate, up = (x[idx] @ w.gate_up[e]).chunk(2, dim=-1)
            y = (F.silu(gate) * up) @ w.down[e]
            out.index_add_(0, idx, y * weights.flatten()[order[start:start + count]][:, None])
            start += count
        return out

    def _qkv(self, w: LayerWeights, x: torch.Tensor, positions: torch.Tensor):
        s = self.spec
        qkv = F.rms_norm(x, (s.hidden,), w.norm1) @ w.wqkv
        q, k, v = qkv.split((s.q_heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim), dim=-1)
        n = x.shape[0]
        q = self._rope(q.view(n, s.q_heads, s.head_dim), positions)
        k = self._rope(k.view(n, s.kv_heads, s.head_dim), positions)
        return q, k, v.view(n, s.kv_heads, s.head_dim)

    # ---- prefill ----------------------------------------------------------------
    def prefill(self, x: torch.Tensor, start: int, past: Sequence[tuple[torch.Tensor, torch.Tensor]] | None,
                keep: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None) -> torch.Tensor:
        """Run ``x`` [n, hidden] (tokens at positions start..start+n-1) through the stack.
        ``past[layer]`` = (K, V) [start, kv_heads, head_dim] of the cached prefix (None: no
        prefix); ``keep(layer, k, v)`` receives the new tokens' K/V of each layer."""
        s = self.spec
        n = x.shape[0]
        positions = torch.arange(start, start + n, device=self.device)
        mask = causal_lower_right(n, start + n) if start else None
        for i, w in enumerate(self.layers):
            q, k, v = self._qkv(w, x, positions)
            if keep is not None:
                keep(i, k, v)
            if past is not None and start:
                k = torch.cat((past[i][0], k))
                v = torch.cat((past[i][1], v))
            attn = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                attn_mask=mask, is_causal=mask is None, enable_gqa=True)
            x = x + attn[0].transpose(0, 1).reshape(n, s.q_heads * s.head_dim) @ w.wo
            x = x + self._mlp(w, F.rms_norm(x, (s.hidden,), w.norm2))
        return x

    # ---- decode -----------------------------------------------------------------
    def decode(self, x: torch.Tensor, positions: torch.Tensor, past_k: list[torch.Tensor],
               past_v: list[torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
        """One decode step for a batch: ``x`` [B, hidden]; ``past_k[layer]`` [B, kv_heads, ctx + 1,
        head_dim] holds each sequence's context (padded to one length) and a free last
        position, where the new token's K/V is written in place (no copy of the cache);
        ``mask`` [B, 1, 1, ctx + 1] says which keys are real (None: all)."""
        s = self.spec
        b = x.shape[0]
        for i, w in enumerate(self.layers):
            q, k, v = self._qkv(w, x, positions)
            past_k[i][:, :, -1] = k
            past_v[i][:, :, -1] = v
            attn = F.scaled_dot_product_attention(q[:, :, None, :], past_k[i], past_v[i], attn_mask=mask, enable_gqa=True)
            x = x + attn.reshape(b, s.q_heads * s.head_dim) @ w.wo
            x = x + self._mlp(w, F.rms_norm(x, (s.hidden,), w.norm2))
        return x


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_clock() -> Callable[[], float]:
    """The clock for work on the CPU: with one torch thread, this thread's CPU time (what the
    work cost, whatever else the machine runs); with more, wall time."""
    return time.thread_time if torch.get_num_threads() == 1 else time.perf_counter


def time_call(fn: Callable[[], object], device: torch.device, repeats: int = 3, warmup: int = 1,
              min_time_s: float = 0.0) -> float:
    """Minimum seconds of at least ``repeats`` calls after ``warmup`` (CUDA events on a GPU),
    repeating (up to 100 calls) until ``min_time_s`` has been spent: on a busy machine the
    minimum of many short calls is the one the others did not disturb."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    best, spent, calls = math.inf, 0.0, 0
    clock = host_clock()
    while calls < repeats or (spent < min_time_s and calls < 100):
        calls += 1
        t_call = time.perf_counter()
        if device.type == "cuda":
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            end.synchronize()
            best = min(best, begin.elapsed_time(end) / 1e3)
        else:
            t0 = clock()
            fn()
            best = min(best, clock() - t0)
        spent += time.perf_counter() - t_call
    return best
