"""Locust users for a kvemu cluster (or another OpenAI-compatible server that streams SSE).

    locust -f loadgen/locustfile.py --host http://127.0.0.1:8000              # web UI on :8089
    locust -f loadgen/locustfile.py --host http://127.0.0.1:8000 --headless -u 30 -r 5 -t 5m \\
        --kvemu-think-scale 0.1 --kvemu-weights single=2,chat=1,agent=1

Three user classes, one per traffic kind of the ``mix`` workload (``loadgen/workloads.py``):

* ``SingleTurnUser`` -- one request: a popular system prompt (Zipf–Mandelbrot catalog of the
  ``single`` preset) + a unique payload.
* ``ChatUser`` -- multi-turn chat sessions (``chat`` preset): the whole growing history is
  resent every turn through ``/v1/chat/completions``, think time between turns.
* ``AgentUser`` -- agentic sessions (``agent`` preset): many turns seconds apart, the context
  grows by the model's replies and tool-output messages (``role: tool``; kvemu accepts them
  without the ``tool_calls`` bookkeeping a real model server may insist on).

Every length, turn count, catalog and gap is drawn from the preset dataclasses with the same
functions the trace generator uses, so ``--kvemu-set chat.gap_median=5`` means what
``kvemu gen --workload chat --set gap_median=5`` means.  Timing follows the presets: turn j+1
is *sent* ``gap`` seconds after turn j was sent (the gap covers service time, like
``constant_pacing``); if turn j took longer than the gap, turn j+1 goes at once.  A user
starts its next session one gap after the last turn of the previous one.  ``SingleTurnUser``
sends Poisson arrivals at the ``single`` preset's ``request_rate`` (per user).  Every gap is
multiplied by ``--kvemu-think-scale``.

All requests stream (``stream: true``); a request's Locust time runs until ``data: [DONE]``,
and the time from sending to the first SSE data chunk is reported as its own metric with
request type ``TTFT`` (same name as the request: ``single`` / ``chat`` / ``agent``), which the
``Aggregated`` row leaves out: it counts real HTTP requests only.  Session
ids go in ``X-Session-Id``.  A non-200 answer, an in-band ``error`` event or a stream that
ends without ``[DONE]`` is a failure.  So is a request still unfinished after
``--kvemu-timeout`` seconds (a stream still going at that mark, or one that stalls that long): it
fails as ``timed out after N s`` (one row in Locust's failures), and its connection is dropped, so
the replica aborts it (``kvemu_requests_aborted_total``) rather than decode on for nobody.

Locust runs on gevent: these are Locust's own ``HttpUser`` s, no asyncio.  Custom options
(also settable through the environment variables in brackets, and, except the weights,
which are read once at start-up, in the web UI):

    --kvemu-think-scale  [KVEMU_THINK_SCALE]  multiply every gap (0.01 for a short smoke run)
    --kvemu-max-tokens   [KVEMU_MAX_TOKENS]   cap on max_tokens per request (0 = preset lengths)
    --kvemu-weights      [KVEMU_WEIGHTS]      e.g. single=2,chat=1,agent=1 (default: mix preset)
    --kvemu-set          [KVEMU_SET]          preset overrides, e.g. chat.turns_mean=4,agent.gap_median=1
    --kvemu-catalog-seed [KVEMU_CATALOG_SEED] seed of the system-prompt catalogs (same on every worker)
    --kvemu-model        [KVEMU_MODEL]        "model" field of the requests
    --kvemu-timeout      [KVEMU_TIMEOUT]      per-request timeout in seconds (the whole stream)
"""

from __future__ import annotations

import functools
import json
import os
import random
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

try:
    import loadgen  # noqa: F401  (installed package)
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np
import requests
from locust import HttpUser, events, task

from loadgen.presets.common import lognormal, lognormal_int, sample_catalog, sample_turns
from loadgen.presets.interactive import MixPreset
from loadgen.workloads import get_preset, parameters
from shared.errors import InputError, KvemuError

KINDS = ("single", "chat", "agent")
_MAX_OUTPUT = 65_536  # the replica's default max_output_tokens
_MESSAGE_OVERHEAD = 12  # tokens the chat template adds around one message (ChatML markers)
_WORDS = ("able", "about", "account", "actor", "agent", "answer", "array", "batch", "before", "branch",
          "buffer", "build", "cache", "call", "change", "check", "client", "cluster", "commit", "config",
          "context", "cursor", "data", "debug", "deploy", "detail", "error", "event", "field", "file",
          "filter", "format", "function", "graph", "handle", "header", "index", "input", "issue", "item",
          "json", "kernel", "key", "layer", "limit", "line", "list", "load", "local", "logic", "match",
          "memory", "merge", "method", "model", "module", "node", "number", "object", "output", "parse",
          "patch", "path", "policy", "port", "prefix", "print", "query", "queue", "range", "reason",
          "record", "remote", "replica", "report", "request", "result", "return", "route", "router",
          "sample", "schema", "search", "server", "session", "shard", "signal", "source", "state",
          "status", "step", "store", "stream", "string", "table", "task", "test", "thread", "token",
          "tool", "trace", "update", "user", "value", "vector", "window", "worker", "write", "yield")


def _text(rng: random.Random, n_tokens: int) -> str:
    """About ``n_tokens`` tokens of kvemu's built-in tokenizer: one token per word."""
    return " ".join(rng.choice(_WORDS) for _ in range(max(int(n_tokens), 1)))


def _approx_tokens(messages: list[dict]) -> int:
    return sum(len(m["content"].split()) + _MESSAGE_OVERHEAD for m in messages)


# ---------------------------------------------------------------- options


@events.init_command_line_parser.add_listener
def _add_arguments(parser, **_kwargs):
    # on the parser itself, not a group: only LocustArgumentParser.add_argument knows include_in_web_ui
    parser.add_argument("--kvemu-think-scale", type=float, default=1.0, env_var="KVEMU_THINK_SCALE",
                        help="multiply every think time / gap (e.g. 0.01 for a short smoke run)")
    parser.add_argument("--kvemu-max-tokens", type=int, default=0, env_var="KVEMU_MAX_TOKENS",
                        help="cap on max_tokens of each request; 0 = the presets' response lengths")
    parser.add_argument("--kvemu-weights", default="", env_var="KVEMU_WEIGHTS",
                        help="user-class weights, e.g. single=2,chat=1,agent=1 (default: the mix preset's fractions)",
                        include_in_web_ui=False)  # read once at start-up; the UI's class picker is the live way
    parser.add_argument("--kvemu-set", default="", env_var="KVEMU_SET",
                        help="preset overrides KIND.NAME=VALUE,..., e.g. chat.turns_mean=4,agent.gap_median=1")
    parser.add_argument("--kvemu-catalog-seed", type=int, default=0, env_var="KVEMU_CATALOG_SEED",
                        help="seed of the system-prompt catalogs (keep it equal on every worker)")
    parser.add_argument("--kvemu-model", default="kvemu", env_var="KVEMU_MODEL", help="the requests' model field")
    parser.add_argument("--kvemu-timeout", type=float, default=600.0, env_var="KVEMU_TIMEOUT",
                        help="per-request timeout in seconds, the whole stream (a request still going then fails)")


def _opt(environment, name: str, default):
    opts = getattr(environment, "parsed_options", None)
    value = getattr(opts, name, None) if opts is not None else None
    return default if value is None else value


def parse_weights(text: str) -> dict[str, int]:
    """``single=2,chat=1,agent=1`` -> weights; kinds not named keep the mix preset's default."""
    mix = MixPreset()
    fracs = {"single": mix.single_frac, "chat": mix.multi_frac, "agent": mix.agent_frac}
    smallest = min(f for f in fracs.values() if f > 0)
    weights = {k: int(round(f / smallest)) for k, f in fracs.items()}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, eq, value = part.partition("=")
        kind = {"multi": "chat"}.get(kind.strip(), kind.strip())
        if not eq or kind not in KINDS:
            raise KvemuError(f"--kvemu-weights: expected KIND=INT with KIND in {', '.join(KINDS)}, got {part!r}")
        try:
            weights[kind] = int(value)
        except ValueError:
            raise KvemuError(f"--kvemu-weights: {kind} weight must be an integer, got {value!r}") from None
        if weights[kind] < 0:
            raise KvemuError(f"--kvemu-weights: {kind} weight must be >= 0")
    if not any(weights.values()):
        raise KvemuError("--kvemu-weights: at least one weight must be positive")
    return weights


def parse_overrides(text: str) -> dict[str, dict[str, str]]:
    """``chat.gap_median=5,agent.turns_mean=10`` -> {"chat": {"gap_median": "5"}, ...}."""
    out: dict[str, dict[str, str]] = {k: {} for k in KINDS}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        kind, dot, name = key.strip().partition(".")
        kind = {"multi": "chat"}.get(kind, kind)
        if not eq or not dot or kind not in KINDS:
            raise KvemuError(f"--kvemu-set: expected KIND.NAME=VALUE with KIND in {', '.join(KINDS)}, got {part!r}")
        out[kind][name] = value.strip()
    return out


@functools.lru_cache(maxsize=16)
def presets(overrides_text: str) -> dict[str, object]:
    """The chat / agent / single preset instances, defaults from loadgen.presets + overrides."""
    overrides = parse_overrides(overrides_text)
    out = {}
    for kind in KINDS:
        try:
            out[kind] = get_preset(kind, overrides[kind])
        except InputError as exc:
            raise KvemuError(f"--kvemu-set {kind}.{exc}") from None
    return out


@events.init.add_listener
def _apply_weights(environment, **_kwargs):
    try:
        presets(_opt(environment, "kvemu_set", ""))  # fail fast on a bad --kvemu-set
        weights = parse_weights(_opt(environment, "kvemu_weights", ""))
    except KvemuError as exc:  # SystemExit passes through Locust's event hook; a traceback would not stop it
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    for cls in (SingleTurnUser, ChatUser, AgentUser):
        cls.weight = weights[cls.kind]
    if environment.user_classes:
        kept = [c for c in environment.user_classes if getattr(c, "weight", 1) > 0 or getattr(c, "fixed_count", 0)]
        environment.user_classes[:] = kept


# ---------------------------------------------------------------- system-prompt catalogs


class Catalog:
    """A preset's popular system prompts: lengths and Zipf–Mandelbrot popularity from
    ``loadgen.presets.common.sample_catalog``; texts are deterministic in (kind, index, seed),
    so every Locust worker sends byte-identical system prompts."""

    def __init__(self, kind: str, params, seed: int):
        rng = np.random.default_rng(seed)
        self.kind, self.seed = kind, seed
        self.catalog = sample_catalog(rng, kind, params.system_prompts, params.system_median, params.system_sigma,
                                      params.zipf_s, params.zipf_q)
        self._texts: dict[int, str] = {}

    def pick(self, rng: np.random.Generator) -> int:
        return int(self.catalog.pick(rng, 1)[0])

    def text(self, idx: int) -> str | None:
        if idx < 0:
            return None
        text = self._texts.get(idx)
        if text is None:
            wrng = random.Random(f"kvemu-system/{self.kind}/{idx}/{self.seed}")
            text = f"You are assistant {self.kind}-{idx}. " + _text(wrng, int(self.catalog.tokens[idx]))
            self._texts[idx] = text
        return text


@functools.lru_cache(maxsize=16)
def catalog(kind: str, overrides_text: str, seed: int) -> Catalog:
    return Catalog(kind, presets(overrides_text)[kind], seed)


# ---------------------------------------------------------------- users


@dataclass(slots=True)
class _Stream:
    """What one streamed request's reading has seen so far (kept where it fails halfway)."""

    t0: float  # perf_counter at the send
    ttft_ms: float | None = None
    done_at: float | None = None  # perf_counter at data: [DONE]
    nbytes: int = 0
    reply: list[str] = field(default_factory=list)


class KvemuUser(HttpUser):
    """Shared plumbing: options, random streams, one streamed chat request."""

    abstract = True
    kind = ""

    def on_start(self) -> None:
        env = self.environment
        self.think_scale = max(float(_opt(env, "kvemu_think_scale", 1.0)), 0.0)
        self.max_tokens_cap = int(_opt(env, "kvemu_max_tokens", 0))
        self.model = str(_opt(env, "kvemu_model", "kvemu"))
        self.timeout = float(_opt(env, "kvemu_timeout", 600.0))
        overrides = str(_opt(env, "kvemu_set", ""))
        self.params: Any = presets(overrides)[self.kind]  # the kind's preset dataclass
        self.catalog = catalog(self.kind, overrides, int(_opt(env, "kvemu_catalog_seed", 0)))
        self.rng = np.random.default_rng()  # lengths, turns, gaps: fresh per user
        self.words = random.Random(os.urandom(16))  # message texts
        self._next_send = 0.0

    # -- timing ---------------------------------------------------------------------------
    def _pace(self, gap_s: float) -> None:
        """The next request goes ``gap_s * think_scale`` seconds after this one was sent."""
        self._next_send = self._sent_at + gap_s * self.think_scale

    def wait_time(self) -> float:
        return max(self._next_send - time.monotonic(), 0.0)

    def _gap(self) -> float:
        return float(lognormal(self.rng, self.params.gap_median, self.params.gap_sigma, 1)[0])

    def _length(self, median: float, sigma: float) -> int:
        return int(lognormal_int(self.rng, median, sigma, 1, hi=1 << 17)[0])

    def _max_tokens(self) -> int:
        n = self._length(self.params.response_median, self.params.response_sigma)
        if self.max_tokens_cap > 0:
            n = min(n, self.max_tokens_cap)
        return max(1, min(n, _MAX_OUTPUT))

    # -- one streamed request ---------------------------------------------------------------
    def chat(self, messages: list[dict], session: str, max_tokens: int) -> str | None:
        """POST /v1/chat/completions with ``stream: true``; returns the reply text, None on failure."""
        body = {"model": self.model, "messages": messages, "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}}
        headers = {"X-Session-Id": session, "Accept": "text/event-stream"}
        name = self.kind
        self._sent_at = time.monotonic()
        read = _Stream(time.perf_counter())
        error = None
        with self.client.post("/v1/chat/completions", json=body, headers=headers, stream=True, name=name,
                              catch_response=True, timeout=self.timeout) as resp:
            try:
                if getattr(resp, "error", None) is not None and resp.status_code == 0:
                    error = self._timed_out() if _is_timeout(resp.error) else \
                        f"{type(resp.error).__name__}: {resp.error}"
                elif resp.status_code != 200:
                    error = f"HTTP {resp.status_code}: {(resp.text or '')[:200]}"
                else:
                    error = self._read_stream(resp, read)
            except Exception as exc:  # noqa: BLE001 - a broken stream is a failed request
                error = self._timed_out() if _is_timeout(exc) else f"{type(exc).__name__}: {exc}"
            finally:
                if resp.raw is not None:
                    resp.close()
            resp.request_meta["response_time"] = ((read.done_at or time.perf_counter()) - read.t0) * 1000.0
            resp.request_meta["response_length"] = read.nbytes
            if error:
                resp.failure(error)
            else:
                resp.success()
        if read.ttft_ms is not None and not error:
            # Its own row, kept out of the Aggregated row (which counts real HTTP requests only):
            # an entry's log() feeds that entry alone, and workers ship entries and totals apart.
            self.environment.stats.get(name, "TTFT").log(read.ttft_ms, 0)
        return None if error else "".join(read.reply)

    def _read_stream(self, resp, read: _Stream) -> str | None:
        """Read a 200 response's server-sent events into ``read`` (first-token time, the reply, bytes);
        the failure, or None once ``data: [DONE]`` came."""
        buf = b""
        deadline = read.t0 + self.timeout
        for chunk in resp.iter_content(chunk_size=None):
            read.nbytes += len(chunk)
            if read.done_at is not None:
                continue  # read the rest (the chunked end) so the connection is reused
            if time.perf_counter() > deadline:
                return self._timed_out()  # closing the response drops the connection: the replica aborts it
            buf = (buf + chunk).replace(b"\r\n", b"\n")
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                data = _sse_data(event)
                if data is None:
                    continue
                if read.ttft_ms is None:
                    read.ttft_ms = (time.perf_counter() - read.t0) * 1000.0
                if data == "[DONE]":
                    read.done_at = time.perf_counter()
                    break
                error = _collect(data, read.reply)
                if error:
                    return error  # stop reading; closing the response drops the connection
        return None if read.done_at is not None else "stream ended without data: [DONE]"

    def _timed_out(self) -> str:
        """The failure of a request still unfinished after the timeout: one message, one failures row."""
        return f"timed out after {self.timeout:g} s"


def _is_timeout(exc: BaseException) -> bool:
    """A timeout of requests (connect, or no byte for the timeout), however it is wrapped."""
    if isinstance(exc, requests.exceptions.Timeout):
        return True
    return isinstance(exc, requests.exceptions.ConnectionError) and "timed out" in str(exc)


def _sse_data(event: bytes) -> str | None:
    lines = [ln[5:].lstrip() for ln in event.decode("utf-8", "replace").splitlines() if ln.startswith("data:")]
    return "\n".join(lines) if lines else None


def _collect(data: str, reply: list[str]) -> str | None:
    """Append a chunk's text to ``reply``; return an error message for an in-band error."""
    try:
        obj = json.loads(data)
    except json.JSONDecodeError:
        return f"malformed SSE data: {data[:100]!r}"
    if not isinstance(obj, dict):
        return f"unexpected SSE data: {data[:100]!r}"
    if "error" in obj:
        err = obj["error"]
        return f"in-band error: {err.get('message', err) if isinstance(err, dict) else err}"
    for choice in obj.get("choices") or ():
        delta = choice.get("delta") or {}
        text = delta.get("content") or choice.get("text")
        if text:
            reply.append(text)
    return None


class SingleTurnUser(KvemuUser):
    """Single-turn requests: popular system prompt + unique payload (``single`` preset)."""

    kind = "single"
    weight = 1

    def _interarrival(self) -> float:
        return float(self.rng.exponential(1.0 / self.params.request_rate)) * self.think_scale

    @task
    def single(self) -> None:
        p = self.params
        request_id = uuid.uuid4().hex
        messages = []
        system = self.catalog.text(self.catalog.pick(self.rng))
        if system is not None:
            messages.append({"role": "system", "content": system})
        payload = _text(self.words, self._length(p.payload_median, p.payload_sigma))
        messages.append({"role": "user", "content": f"request {request_id}: {payload}"})
        self.chat(messages, f"single-{request_id}", self._max_tokens())
        self._next_send = self._sent_at + self._interarrival()


class _SessionUser(KvemuUser):
    """A user runs sessions back to back; every task run is one turn."""

    abstract = True

    def on_start(self) -> None:
        super().on_start()
        self.messages: list[dict] = []
        self.turns_left = 0
        self.session = ""
        self.sessions = 0

    def _new_session(self) -> None:
        p = self.params
        self.session = f"{self.kind}-{uuid.uuid4().hex[:16]}"
        self.sessions += 1
        self.turns_left = int(sample_turns(self.rng, p.turns_median, p.turns_mean, p.max_turns, 1)[0])
        self.messages = []
        system = self.catalog.text(self.catalog.pick(self.rng))
        if system is not None:
            self.messages.append({"role": "system", "content": system})

    def _next_message(self, first: bool) -> dict:
        raise NotImplementedError

    @task
    def turn(self) -> None:
        if self.turns_left <= 0:
            self._new_session()
        first = not any(m["role"] != "system" for m in self.messages)
        message = self._next_message(first)
        if not first and _approx_tokens(self.messages + [message]) > self.params.max_context:
            self.turns_left = 0  # the session would outgrow the context window: it ends here
            self._new_session()
            first, message = True, self._next_message(True)
        self.messages.append(message)
        reply = self.chat(self.messages, self.session, self._max_tokens())
        self.turns_left -= 1
        if reply is None:  # a failed turn ends the session (a client would give up or start over)
            self.turns_left = 0
        else:
            self.messages.append({"role": "assistant", "content": reply})
        self._pace(self._gap())


class ChatUser(_SessionUser):
    """Multi-turn chat sessions (``chat`` preset): full history resent each turn."""

    kind = "chat"
    weight = 1

    def _next_message(self, first: bool) -> dict:
        p = self.params
        return {"role": "user", "content": _text(self.words, self._length(p.prompt_median, p.prompt_sigma))}


class AgentUser(_SessionUser):
    """Agentic sessions (``agent`` preset): a task, then tool outputs, seconds apart."""

    kind = "agent"
    weight = 1

    def _next_message(self, first: bool) -> dict:
        p = self.params
        if first:
            return {"role": "user", "content": "Task: " + _text(self.words, self._length(p.task_median, p.task_sigma))}
        return {"role": "tool", "content": "Tool output: " + _text(self.words, self._length(p.tool_median,
                                                                                          p.tool_sigma))}


def describe() -> str:
    """The preset parameters these users draw from (``python loadgen/locustfile.py``)."""
    lines = []
    for kind, params in presets("").items():
        lines.append(f"{kind}: " + ", ".join(f"{k}={v}" for k, v in parameters(params).items()))
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe())
