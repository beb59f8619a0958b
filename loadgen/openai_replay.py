"""Replay a trace against any OpenAI-compatible server (vLLM, SGLang, a kvemu router or replica), timing what
its client sees: ``kvemu replay --requests-out``. The schedule is ``loadgen.replay.Replayer``'s (open loop in
time, causal within a session, an agent's requests after what they wait for); each request is a streamed
``POST /v1/completions`` whose prompt is token ids:

* a token-id trace's own prompt (``TraceRequest.token_ids``), the exact tokens a recorded run was sent;
* otherwise ids drawn from each prompt block's hash (``prompt_ids``): prompts that share a chained hash share
  those tokens, so a server's prefix cache hits where the trace's blocks repeat, at any block size.

The output is pinned to the trace's length (``max_tokens = min_tokens``, ``ignore_eos``: vLLM's and SGLang's
sampling options). Per request (``loadgen.request_metrics.RequestRecord``): its arrival, when the schedule released
it (``Replayer.released``: it leaves then, or when a connection frees), when its first chunk with a choice came,
when its last one came (the one with ``finish_reason``), the prompt and output tokens the server's usage
reports (else what was sent and asked), ``cached_tokens`` from
``usage.prompt_tokens_details`` (else null), ``replica`` from ``X-Kvemu-Replica`` (else null); ``preemptions``
is null (no server reports them per request). The gaps between successive chunks are the run's ITL samples,
as vLLM's benchmark takes them.
"""

from __future__ import annotations

import time

import aiohttp
import numpy as np
import orjson

from loadgen.replay import GIVE_UP_S, Record, Replayer
from loadgen.request_metrics import RequestRecord
from loadgen.trace import Trace, TraceRequest
from shared.hashing import content_id

# The ids drawn for a trace of hashes: clear of the low ids where vocabularies keep their special tokens, and
# below every common vocabulary's size (OPT's 50,272, Llama 3's 128,256, Qwen's 151,936).
FIRST_ID, END_ID = 1_000, 30_000


def _drawn(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(FIRST_ID, END_ID, n).tolist()


def prompt_ids(r: TraceRequest, block_size: int) -> list[int]:
    """The token ids sent as ``r``'s prompt: its own where the trace has them; else ``block_size`` ids drawn from
    each block's chained hash, then the partial tail's from the request's own seed, ``input_tokens`` in all (a
    Mooncake id that covers a partial last block gives only the tokens the prompt has)."""
    if r.token_ids is not None:
        return r.token_ids[:r.input_tokens]
    out: list[int] = []
    for h in r.hash_ids:
        if len(out) >= r.input_tokens:
            break
        out += _drawn(h, block_size)
    if len(out) < r.input_tokens:
        out += _drawn(content_id("tail", r.session, r.turn), r.input_tokens - len(out))
    return out[:r.input_tokens]


class _Stream:
    """What one streamed answer told: its chunks' times and its usage."""

    __slots__ = ("first", "last", "finished", "usage", "gaps")

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.finished = False
        self.usage: dict | None = None
        self.gaps: list[float] = []

    def line(self, raw: bytes, now: float) -> None:
        if not raw.startswith(b"data:"):
            return
        data = raw[5:].strip()
        if not data or data == b"[DONE]":
            return
        obj = orjson.loads(data)
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        choices = obj.get("choices")
        if not choices:
            return
        if self.first is None:
            self.first = now
        elif self.last is not None:
            self.gaps.append(now - self.last)
        self.last = now
        if choices[0].get("finish_reason") is not None:
            self.finished = True


class OpenAIReplayer(Replayer):
    """``Replayer``'s schedule, each request a streamed completion; ``results`` holds one ``RequestRecord`` per
    request sent, by its index in the trace, and ``itl`` every gap between two chunks."""

    def __init__(self, url: str, trace: Trace, model: str, speedup: float, max_requests: int | None = None,
                 connections: int = 256, timeout_s: float = 600.0, progress: bool = True,
                 give_up_s: float = GIVE_UP_S, dependent: bool = False) -> None:
        super().__init__(url, trace, speedup, max_requests, connections, timeout_s, progress, give_up_s=give_up_s,
                         dependent=dependent)
        self.model = model
        self.index = {id(r): k for k, r in enumerate(trace.requests)}
        self.results: dict[int, RequestRecord] = {}
        self.itl: list[float] = []

    def request_records(self) -> list[RequestRecord]:
        return [self.results[k] for k in sorted(self.results)]

    async def _send(self, http: aiohttp.ClientSession, r: TraceRequest) -> Record:
        prompt = prompt_ids(r, self.trace.block_size)
        out = max(r.output_tokens, 1)
        body = {"model": self.model, "prompt": prompt, "max_tokens": out, "min_tokens": out, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        sent = time.monotonic()
        rec = Record(r.session, r.turn, 0, "", len(prompt), 0, len(r.hash_ids), 0, 0.0, 0.0, 0.0, sent - self.t0)
        stream = _Stream()
        replica = None
        try:
            async with http.post(self.url + "/v1/completions", data=orjson.dumps(body),
                                 headers={"Content-Type": "application/json", "X-Session-Id": r.session}) as resp:
                rec.status = resp.status
                replica = resp.headers.get("X-Kvemu-Replica")
                if resp.status != 200:
                    rec.error = (await resp.read())[:200].decode(errors="replace")
                else:
                    async for raw in resp.content:
                        stream.line(raw, time.monotonic())
                    if not stream.finished:
                        rec.error = "the stream ended before its last token"
        except TimeoutError:
            rec.timed_out = True
            rec.error = f"timed out after {self.timeout.total:g} s"
        except (aiohttp.ClientError, OSError, orjson.JSONDecodeError) as exc:
            rec.error = f"{type(exc).__name__}: {exc}"
        rec.wall_s = time.monotonic() - sent
        self._keep(r, rec, stream, replica, sent, prompt, out)
        return rec

    def _lose(self, k: int, failed: TraceRequest) -> None:
        """Never sent (a request it waits for failed): a record with no times but the moment it was lost."""
        super()._lose(k, failed)
        r = self.chosen[k]
        self.results[k] = RequestRecord(k, time.monotonic() - self.t0, None, None, r.input_tokens,
                                        max(r.output_tokens, 1), None, None, None)

    def _keep(self, r: TraceRequest, rec: Record, stream: _Stream, replica: str | None, sent: float,
              prompt: list[int], out: int) -> None:
        """``r``'s record, and ``rec``'s fields the replay's own summary reads; only a whole answer has times."""
        usage = stream.usage or {}
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        whole = rec.status == 200 and stream.finished and not rec.error
        first = stream.first - self.t0 if whole and stream.first is not None else None
        finish = stream.last - self.t0 if whole and stream.last is not None else None
        n_in = usage.get("prompt_tokens", len(prompt))
        n_out = usage.get("completion_tokens", out)
        k = self.index[id(r)]
        # its computed arrival: when the schedule released it (it leaves then, or when a connection frees)
        arrival = self.released.get(k, sent - self.t0)
        self.results[k] = RequestRecord(k, arrival, first, finish, n_in, n_out, cached, None, replica)
        rec.replica = replica or ""
        rec.cached_tokens = cached or 0
        rec.cached_blocks = (cached or 0) // self.trace.block_size
        if first is not None and finish is not None:
            rec.ttft_s, rec.e2e_s = first - (sent - self.t0), finish - (sent - self.t0)
            self.itl += stream.gaps
