"""The measurements behind ``kvemu calibrate``: one torch layer stack timed on one device.

``prefill_fn`` (one sequence's chunk over a cached prefix), ``decode_fn`` (a batch of decode
tokens) and ``step_fn`` (a mixed step: prefill chunks and decoders packed into one forward,
as the torch backend runs every step) return calls to time; cached K/V are random tensors on
the device, shared between the points that need the same shapes."""

from __future__ import annotations

import torch

from replica.backends.torchstack import KV, DecodeGroup, PackedSeq, TorchStack, synchronize, time_call
from shared.costmodel import ModelSpec

METHOD = ("the model's layer stack (RMSNorm, fused QKV, rotary, GQA attention through torch "
          "scaled_dot_product_attention with a lower-right causal mask over the cached prefix, SwiGLU MLP, or "
          "fc1-ReLU-fc2 for a two-matrix MLP, or routed experts computing only the active ones), random weights, "
          "bf16 on a GPU and float32 on the CPU; one forward per point over its packed tokens (linear layers once "
          "over all rows, attention per sequence; decoders in one padded masked call); cached K/V random "
          "tensors on the device; time = minimum of --repeats timings after one warm-up (CUDA events on a GPU); "
          "decode-only steps through a CUDA graph where it captures, prefill and mixed steps eager")


class Calibrator:
    def __init__(self, spec: ModelSpec, device: str, layers: int, seed: int = 0, repeats: int = 3,
                 min_time_s: float = 0.0) -> None:
        self.spec, self.repeats, self.min_time_s = spec, repeats, min_time_s
        self.stack = TorchStack(spec, device, layers, seed)
        self.device = self.stack.device
        self.dtype = self.stack.dtype
        self.gen = torch.Generator(device=self.device).manual_seed(seed + 1)
        self._past: dict[int, list[KV] | None] = {}
        self._decode_pasts: dict[tuple[int, int], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
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

    def _prefix(self, depth: int) -> list[KV] | None:
        """Random K/V of a cached prefix of ``depth`` tokens per layer: one per depth, shared by
        the points at that depth (None: no prefix)."""
        s = self.spec
        if depth not in self._past:
            self._past[depth] = [(self._rand(depth, s.kv_heads, s.head_dim), self._rand(depth, s.kv_heads, s.head_dim))
                                 for _ in self.stack.layers] if depth else None
        return self._past[depth]

    def _decode_past(self, batch: int, context: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per layer K and V [batch, kv heads, context + 1, head dim] (a free last position)."""
        s = self.spec
        shape = (batch, s.kv_heads, context + 1, s.head_dim)
        # One K and one V per layer, unless a layer's KV is well beyond the caches (64 MiB): then
        # the layers share one pair (the same bytes cross the memory bus; 128 x 8K tokens of
        # llama-3-8b would otherwise need 137 GB).
        shared = 2 * batch * (context + 1) * s.kv_heads * s.head_dim * self.stack.embed.element_size() > 64 << 20
        if shared:
            return [self._rand(*shape)] * len(self.stack.layers), [self._rand(*shape)] * len(self.stack.layers)
        return [self._rand(*shape) for _ in self.stack.layers], [self._rand(*shape) for _ in self.stack.layers]

    def prefill_fn(self, new_tokens: int, cached_depth: int):
        """A call that prefills ``new_tokens`` over a cached prefix of ``cached_depth`` (random K/V)."""
        x = self._rand(new_tokens, self.spec.hidden)
        past = self._prefix(cached_depth)
        return lambda: self.stack.prefill(x, cached_depth, past)

    def decode_fn(self, batch: int, context: int):
        """A call that runs one decode step of ``batch`` sequences of ``context`` tokens each."""
        x = self._rand(batch, self.spec.hidden)
        pos = torch.full((batch,), context, device=self.device)
        past_k, past_v = self._decode_past(batch, context)
        with torch.inference_mode():
            return self._graphed(lambda: self.stack.decode(x, pos, past_k, past_v))

    def step_fn(self, chunks: list[tuple[int, int]], decoders: list[int]):
        """A call that runs one packed forward of a mixed step: prefill ``chunks`` of (new tokens,
        cached depth) and ``decoders`` each with its context length (padded to the longest in
        one masked attention call, as the torch backend runs them)."""
        seqs: list[PackedSeq | DecodeGroup] = []
        positions: list[torch.Tensor] = []
        rows = 0
        for new, depth in chunks:
            past = self._prefix(depth)
            seqs.append(PackedSeq(slice(rows, rows + new), depth, None if past is None else past.__getitem__))
            positions.append(torch.arange(depth, depth + new))
            rows += new
        if decoders:
            width = max(decoders)
            key = (len(decoders), width)
            if key not in self._decode_pasts:  # shared by the step points with these decoder shapes
                self._decode_pasts[key] = self._decode_past(*key)
            past_k, past_v = self._decode_pasts[key]
            valid = torch.zeros((len(decoders), width + 1), dtype=torch.bool)
            for i, ctx in enumerate(decoders):
                valid[i, :ctx] = True
            valid[:, -1] = True  # the new token itself
            mask = None if min(decoders) == width else valid[:, None, None, :].to(self.device)
            seqs.append(DecodeGroup(slice(rows, rows + len(decoders)), past_k, past_v, mask))
            positions.append(torch.tensor(decoders))
            rows += len(decoders)
        if not rows:
            raise ValueError("step_fn: a step needs a prefill chunk or a decoder")
        x = self._rand(rows, self.spec.hidden)
        pos = torch.cat(positions).to(self.device)
        return lambda: self.stack.forward_packed(x, pos, seqs)

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
