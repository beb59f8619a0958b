"""A model's decoder layer stack in torch, with random weights: what `kvemu calibrate` times
and what `replica --backend torch` runs.

**One forward per step.** ``TorchStack.forward_packed`` runs the tokens of every sequence in a
step packed into one ``[T, hidden]`` tensor, as a chunked-prefill GPU step does (vLLM v1):
the linear layers (fused QKV, output projection, MLP / experts, norms) run once over all T
rows, and only attention is per sequence. A sequence (``PackedSeq``) is a run of new tokens
after a cached prefix: they attend over the prefix's K/V (``past(layer)``, read when the
layer attends, so a prefix the same forward writes into a paged tensor is read as written)
and causally over each other (a lower-right causal mask). Decoders can share one padded
attention call (``DecodeGroup``: one new token each over a padded, masked context).
``prefill`` (one sequence) and ``decode`` (one decode group) are that forward too.

Each layer: RMSNorm, fused QKV projection, rotary positions, grouped-query attention through
``scaled_dot_product_attention``, output projection, RMSNorm, then the MLP: SwiGLU (gate, up,
down), or with ``spec.mlp_matrices == 2`` OPT's fc1 -> ReLU -> fc2 (norms, rotary positions
and bias-free projections stay the Llama ones: OPT's LayerNorm, learned positions and biases
are a sliver of the work); for an MoE model a router and the top-k experts, of which only
the experts some token routes to are computed. Weights come from a seeded generator, so two
stacks built with the same seed compute the same values (on one device: a GPU's generator
draws other numbers than the CPU's), and a block's K/V are a function of its token chain,
up to rounding. Rounding depends on the shape of the products: a row of a matrix product
over T rows need not equal, bit for bit, the same row in a product over other rows (the
GEMM kernel and its reduction order follow the batch shape; one row may take a gemv path),
nor does attention over a longer run of queries round each query the same. So the K/V of
a block computed in a packed step agree with a recompute to float rounding (float32: ~1e-6),
not bit for bit.
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

KV = tuple[torch.Tensor, torch.Tensor]
Keep = Callable[[int, torch.Tensor, torch.Tensor], None]


def pick_dtype(device: str) -> torch.dtype:
    """bf16 on a GPU (what serving runs); float32 on the CPU (its bf16 products are slow)."""
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


@dataclass(slots=True)
class LayerWeights:
    norm1: torch.Tensor
    wqkv: torch.Tensor  # [hidden, (q + 2 kv) head_dim]
    wo: torch.Tensor  # [q head_dim, hidden]
    norm2: torch.Tensor
    # SwiGLU: [hidden, 2 inter] (gate | up); 2-matrix MLP: [hidden, inter] (fc1); MoE: [experts, ...]
    gate_up: torch.Tensor
    down: torch.Tensor  # dense [inter, hidden] (down / fc2); MoE [experts, inter, hidden]
    router: torch.Tensor | None  # MoE [hidden, experts]


@dataclass(slots=True)
class PackedSeq:
    """Rows ``rows`` of a packed batch: one sequence's new tokens at positions ``start``,
    ``start`` + 1, ... after a cached prefix of ``start`` tokens. ``past(layer)`` gives the
    prefix's (K, V), each [start, kv heads, head dim]; it is called when that layer attends,
    after ``keep`` has seen the layer's new K/V (None or start 0: no prefix)."""

    rows: slice
    start: int
    past: Callable[[int], KV] | None = None

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """[n, q heads x head dim] attention of the rows' q/k/v ([n, heads, head dim])."""
        n = q.shape[0]
        mask = None
        if self.past is not None and self.start:
            pk, pv = self.past(layer)
            k, v = torch.cat((pk, k)), torch.cat((pv, v))
            mask = causal_lower_right(n, self.start + n)
        attn = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            attn_mask=mask, is_causal=mask is None, enable_gqa=True)
        return attn[0].transpose(0, 1).reshape(n, -1)


@dataclass(slots=True)
class DecodeGroup:
    """Rows ``rows``: one new token each of B decoding sequences, attended in one call.
    ``past_k[layer]`` / ``past_v[layer]`` [B, kv heads, ctx + 1, head dim] hold each sequence's
    context (padded to one length) and a free last position, where the new token's K/V is
    written in place (no copy of the cache: what lets a CUDA graph replay it); ``mask``
    [B, 1, 1, ctx + 1] says which keys are real (None: all)."""

    rows: slice
    past_k: Sequence[torch.Tensor]
    past_v: Sequence[torch.Tensor]
    mask: torch.Tensor | None = None

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.past_k[layer][:, :, -1] = k
        self.past_v[layer][:, :, -1] = v
        attn = F.scaled_dot_product_attention(q[:, :, None, :], self.past_k[layer], self.past_v[layer],
                                              attn_mask=self.mask, enable_gqa=True)
        return attn.reshape(q.shape[0], -1)


class TorchStack:
    """``layers`` layers of ``spec`` (default: all) on ``device``."""

    def __init__(self, spec: ModelSpec, device: str = "cpu", layers: int | None = None, seed: int = 0,
                 dtype: torch.dtype | None = None) -> None:
        self.spec, self.device = spec, torch.device(device)
        self.dtype = dtype or pick_dtype(device)
        self.n_layers = layers or spec.layers
        # getattr: specs built before ModelSpec had the field are SwiGLU
        self.mlp_matrices = getattr(spec, "mlp_matrices", 3)
        if self.mlp_matrices not in (2, 3):
            raise ValueError(f"{spec.name}: mlp_matrices must be 2 or 3, got {self.mlp_matrices}")
        gen = torch.Generator(device=self.device).manual_seed(seed)  # on the device: 8B weights in seconds
        self.embed = self._rand(gen, (spec.vocab, spec.hidden), 1.0)
        self.layers = [self._layer(gen) for _ in range(self.n_layers)]
        half = spec.head_dim // 2
        self.inv_freq = (1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32) / half))).to(self.device)

    def _rand(self, gen: torch.Generator, shape: tuple[int, ...], scale: float) -> torch.Tensor:
        return (torch.randn(shape, generator=gen, device=self.device) * scale).to(self.dtype)

    def _layer(self, gen: torch.Generator) -> LayerWeights:
        s = self.spec
        h, qkv, q_width = s.hidden, (s.q_heads + 2 * s.kv_heads) * s.head_dim, s.q_heads * s.head_dim
        experts = (s.experts,) if s.moe else ()
        ones = torch.ones(h, device=self.device, dtype=self.dtype)
        mlp_in = (2 if self.mlp_matrices == 3 else 1) * s.intermediate  # SwiGLU's gate and up are one product
        return LayerWeights(
            ones, self._rand(gen, (h, qkv), h ** -0.5), self._rand(gen, (q_width, h), q_width ** -0.5),
            ones.clone(), self._rand(gen, (*experts, h, mlp_in), h ** -0.5),
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

    def _ffn(self, x: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor) -> torch.Tensor:
        """One MLP: SwiGLU, or fc1 -> ReLU -> fc2."""
        if self.mlp_matrices == 2:
            return F.relu(x @ w_in) @ w_out
        gate, up = (x @ w_in).chunk(2, dim=-1)
        return (F.silu(gate) * up) @ w_out

    def _mlp(self, w: LayerWeights, x: torch.Tensor) -> torch.Tensor:
        if w.router is None:
            return self._ffn(x, w.gate_up, w.down)
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
            y = self._ffn(x[idx], w.gate_up[e], w.down[e])
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

    # ---- the packed forward --------------------------------------------------------
    def forward_packed(self, x: torch.Tensor, positions: torch.Tensor, seqs: Sequence[PackedSeq | DecodeGroup],
                       keep: Keep | None = None) -> torch.Tensor:
        """Run the packed tokens ``x`` [T, hidden] at ``positions`` [T] through the stack; ``seqs``
        cover the rows (each row in exactly one). ``keep(layer, k, v)`` receives every row's new
        K/V [T, kv heads, head dim] of each layer before any sequence attends in that layer."""
        s = self.spec
        whole = len(seqs) == 1 and seqs[0].rows == slice(0, x.shape[0])
        for i, w in enumerate(self.layers):
            q, k, v = self._qkv(w, x, positions)
            if keep is not None:
                keep(i, k, v)
            if whole:  # one sequence: no scatter of its rows
                attn = seqs[0].attend(i, q, k, v)
            else:
                attn = q.new_empty((x.shape[0], s.q_heads * s.head_dim))
                for seq in seqs:
                    attn[seq.rows] = seq.attend(i, q[seq.rows], k[seq.rows], v[seq.rows])
            x = x + attn @ w.wo
            x = x + self._mlp(w, F.rms_norm(x, (s.hidden,), w.norm2))
        return x

    def prefill(self, x: torch.Tensor, start: int, past: Sequence[KV] | None, keep: Keep | None = None) -> torch.Tensor:
        """Run ``x`` [n, hidden] (one sequence's tokens at positions start..start+n-1) through the
        stack. ``past[layer]`` = (K, V) [start, kv_heads, head_dim] of the cached prefix (None: no
        prefix); ``keep(layer, k, v)`` receives the new tokens' K/V of each layer."""
        n = x.shape[0]
        positions = torch.arange(start, start + n, device=self.device)
        seq = PackedSeq(slice(0, n), start, None if past is None else past.__getitem__)
        return self.forward_packed(x, positions, [seq], keep)

    def decode(self, x: torch.Tensor, positions: torch.Tensor, past_k: Sequence[torch.Tensor],
               past_v: Sequence[torch.Tensor], mask: torch.Tensor | None = None) -> torch.Tensor:
        """One decode step for a batch ``x`` [B, hidden]: one ``DecodeGroup`` (see there)."""
        return self.forward_packed(x, positions, [DecodeGroup(slice(0, x.shape[0]), past_k, past_v, mask)])


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
