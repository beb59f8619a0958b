"""The measurements behind ``kvemu calibrate``: one torch layer stack timed on one device."""

from __future__ import annotations

import torch

from replica.backends.torchstack import TorchStack, synchronize, time_call
from shared.costmodel import ModelSpec

METHOD = ("the model's layer stack (RMSNorm, fused QKV, rotary, GQA attention through torch "
          "scaled_dot_product_attention with a lower-right causal mask over the cached prefix, SwiGLU MLP or "
          "routed experts computing only the active ones), random weights, bf16 on a GPU and float32 on the CPU; "
          "cached K/V random tensors on the device; time = minimum of --repeats timings after one warm-up "
          "(CUDA events on a GPU); decode steps through a CUDA graph where it captures")


class Calibrator:
    def __init__(self, spec: ModelSpec, device: str, layers: int, seed: int = 0, repeats: int = 3,
                 min_time_s: float = 0.0) -> None:
        self.spec, self.repeats, self.min_time_s = spec, repeats, min_time_s
        self.stack = TorchStack(spec, device, layers, seed)
        self.device = self.stack.device
        self.dtype = self.stack.dtype
        self.gen = torch.Generator(device=self.device).manual_seed(seed + 1)
        self._past: dict[int, list | None] = {}
        if self.device.type == "cuda":
            self.device_name = torch.cuda.get_device_name(self.device)
        else:
            self.device_name = f"cpu ({torch.get_num_threads()} threads)"

    def _rand(self, *shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=self.gen, device=self.device, dtype=self.dtype)

    # ---- the device's peak rates ----------------------------------------------------
    def matmul_rate(self) -> float:
        """FLOP/s of a large square product (the 'peak' the efficiencies are fractions of)."""
        n = 8192 if self.device.type == "cuda" else 512
        a, b = self._rand(n, n), self._rand(n, n)
        return 2.0 * n**3 / time_call(lambda: a @ b, self.device, self.repeats)

    def memory_bandwidth(self) -> float:
        """Bytes/s of a large device-to-device copy (read + write)."""
        n = (1 << 30) if self.device.type == "cuda" else (1 << 24)
        src = torch.empty(n, dtype=torch.uint8, device=self.device)
        dst = torch.empty_like(src)
        return 2.0 * n / time_call(lambda: dst.copy_(src), self.device, self.repeats)

    def memory_bytes(self) -> float:
        if self.device.type == "cuda":
            return float(torch.cuda.get_device_properties(self.device).total_memory)
        return 64e9  # not used for the CPU: capacity is given in blocks or GiB

    # ---- the model --------------------------------------------------------------------
    def time(self, fn) -> float:
        with torch.inference_mode():
            return time_call(fn, self.device, self.repeats, min_time_s=self.min_time_s)

    def prefill_fn(self, new_tokens: int, cached_depth: int):
        """A call that prefills ``new_tokens`` over a cached prefix of ``cached_depth`` (random K/V)."""
        s = self.spec
        x = self._rand(new_tokens, s.hidden)
        if cached_depth not in self._past:  # one prefix per depth, shared by the points at that depth
            self._past[cached_depth] = [(self._rand(cached_depth, s.kv_heads, s.head_dim),
                                         self._rand(cached_depth, s.kv_heads, s.head_dim))
                                        for _ in self.stack.layers] if cached_depth else None
        past = self._past[cached_depth]
        return lambda: self.stack.prefill(x, cached_depth, past)

    def decode_fn(self, batch: int, context: int):
        """A call that runs one decode step of ``batch`` sequences of ``context`` tokens each."""
        s = self.spec
        x = self._rand(batch, s.hidden)
        pos = torch.full((batch,), context, device=self.device)
        shape = (batch, s.kv_heads, context + 1, s.head_dim)
        # One K and one V per layer, unless a layer's KV is well beyond the caches (64 MiB): then
        # the layers share one pair (the same bytes cross the memory bus; 128 x 8K tokens of
        # llama-3-8b would otherwise need 137 GB).
        shared = 2 * batch * (context + 1) * s.kv_heads * s.head_dim * self.stack.embed.element_size() > 64 << 20
        if shared:
            past_k = [self._rand(*shape)] * len(self.stack.layers)
            past_v = [self._rand(*shape)] * len(self.stack.layers)
        else:
            past_k = [self._rand(*shape) for _ in self.stack.layers]
            past_v = [self._rand(*shape) for _ in self.stack.layers]
        with torch.inference_mode():
            return self._graphed(lambda: self.stack.decode(x, pos, past_k, past_v))

    def _graphed(self, fn):
        """``fn`` replayed through a CUDA graph when one captures (not the MoE path: its
        routing reads counts on the host), else ``fn`` itself."""
        if self.device.type != "cuda" or self.spec.moe:
            return fn
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                fn()
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn()
            return graph.replay
        except RuntimeError:
            return fn

    # ---- host <-> device -----------------------------------------------------------
    def host_link(self, block_size: int, blocks: int = 512) -> dict:
        """GB/s of pinned copies of ``blocks`` KV blocks: one whole copy each way, and one
        copy call per block into scattered slots."""
        block_bytes = self.spec.kv_bytes_per_token * block_size
        host = torch.empty((blocks, block_bytes), dtype=torch.uint8, pin_memory=True)
        dev = torch.empty((2 * blocks, block_bytes), dtype=torch.uint8, device=self.device)
        slots = torch.randperm(2 * blocks)[:blocks].tolist()
        total = blocks * block_bytes

        def scattered_h2d():
            for i, slot in enumerate(slots):
                dev[slot].copy_(host[i], non_blocking=True)

        def scattered_d2h():
            for i, slot in enumerate(slots):
                host[i].copy_(dev[slot], non_blocking=True)

        out: dict[str, float] = {"block_bytes": block_bytes, "blocks": blocks}
        for name, fn in (("h2d_whole", lambda: dev[:blocks].copy_(host, non_blocking=True)),
                         ("d2h_whole", lambda: host.copy_(dev[:blocks], non_blocking=True)),
                         ("h2d_scattered", scattered_h2d), ("d2h_scattered", scattered_d2h)):
            out[f"{name}_GBps"] = round(total / time_call(fn, self.device, self.repeats) / 1e9, 2)
        synchronize(self.device)
        return out
