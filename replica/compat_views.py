"""SGLang's and vLLM's auxiliary endpoints, so a replica is a drop-in worker behind SGLang's router
(``sglang-router``, the SGLang Model Gateway) and for tools written against either server.

What sglang-router 0.3.2 asks of an HTTP worker (its source at the 0.3.2 release, and watched on
the wire with ``--log-level debug`` against a logging stub):

* registering it: ``GET /health`` and, at the same time, a gRPC health probe (an HTTP/2 preface
  on the same port, which aiohttp refuses with 400; ``quiet_http2_probes`` logs that as one line
  instead of a traceback); then ``GET /server_info`` (``/get_server_info`` after a 404), of
  which it keeps ``model_path``, ``served_model_name``, ``tp_size``, ``dp_size``,
  ``load_balance_method`` and ``disaggregation_mode``. The worker's model id is
  ``served_model_name``, else ``model_path``, else "unknown" (what ``/v1/models`` listed before
  these endpoints). Then ``GET /model_info`` (``/get_model_info`` after a 404), of which it
  keeps ``model_type`` and ``architectures``. It then tries to load a tokenizer named by
  ``model_path`` (a local path, else the Hugging Face Hub); that fails here, with a warning, and
  routing over HTTP does not use one.
* then ``GET /health`` every ``--health-check-interval-secs``, and ``GET /get_load`` (the sum of
  ``num_tokens`` over the list) for its ``power_of_two`` policy and its own ``/get_loads``.
* its own ``/health_generate``, ``/get_model_info`` and ``/get_server_info`` are proxied to the
  first healthy worker's endpoints of those names.

Served here: ``/server_info`` and ``/get_server_info``, ``/model_info`` and ``/get_model_info``,
``/get_load``, ``/health_generate`` (a real one-token generation through the engine), vLLM's
``/tokenize``, ``/detokenize`` and ``/version``. The served model name is ``settings.model``,
what ``/v1/models`` lists.
"""

from __future__ import annotations

import asyncio
import logging
from importlib import metadata

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from replica.runtime import RUNTIME, SETTINGS, ReplicaRuntime
from replica.settings import ReplicaSettings
from shared import protocol, tokenizer
from shared.errors import InputError, KvemuError
from shared.httpkit import read_body, respond

log = logging.getLogger("replica.compat")

HEALTH_GENERATE_TIMEOUT_S = 20.0  # SGLang's default (SGLANG_HEALTH_CHECK_TIMEOUT)
_PACE = 65_536  # tokens between yields to the event loop while tokenizing or decoding a long input
_SHOWN = 64  # at most this many ambiguous positions are listed in a /detokenize answer
# What the chat template ends with when it asks for the assistant's turn (add_generation_prompt).
_GENERATION_PROMPT = tokenizer.chat_template([])


def _version() -> str:
    try:
        return metadata.version("kvemu")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"


VERSION = _version()


def _state(request: web.Request) -> ReplicaRuntime:
    return request.app[RUNTIME]


def _settings(request: web.Request) -> ReplicaSettings:
    return request.app[SETTINGS]


def served_model_name(settings: ReplicaSettings) -> str:
    """The name clients address the model by: what ``/v1/models`` lists."""
    return settings.model


def _max_req_input_len(s: ReplicaSettings) -> int:
    return max(min(s.serving.max_prompt_tokens, s.resolved_max_model_len() - 1), 0)


# ---- SGLang: what its router reads when it registers a worker ------------------------------------
def server_info_body(state: ReplicaRuntime, s: ReplicaSettings) -> dict:
    """SGLang's ``/server_info`` (its server arguments, flattened): the fields sglang-router reads,
    with this replica's real figures where SGLang has a matching argument, and a ``kvemu`` part."""
    name = served_model_name(s)
    pool = state.core.pool
    return {
        "model_path": name, "served_model_name": name, "tokenizer_path": None, "version": VERSION,
        "tp_size": state.cost.tp, "dp_size": len(state.cores), "pp_size": 1, "load_balance_method": "round_robin",
        "disaggregation_mode": "null" if s.role == "both" else s.role, "is_embedding": False, "host": s.serving.host, "port": s.port,
        "context_length": s.resolved_max_model_len(), "max_req_input_len": _max_req_input_len(s),
        "max_total_num_tokens": pool.capacity * s.block_size, "page_size": s.block_size,
        "max_prefill_tokens": s.knobs.token_budget, "chunked_prefill_size": s.knobs.token_budget,
        "max_running_requests": s.knobs.max_running, "max_queued_requests": s.max_waiting,
        "schedule_policy": s.knobs.scheduler, "disable_radix_cache": s.knobs.prefix_caching == "off",
        "kvemu": {"replica_id": s.replica_id, "model_preset": state.cost.model.name, "gpu": state.cost.gpu.name,
                  "policy": pool.policy.name, "capacity_blocks": pool.capacity, "block_size": s.block_size,
                  "time_scale": s.time_scale, "backend": s.backend, "response_kv": s.stored_response_kv, "role": s.role,
                  "prefix_caching": s.knobs.prefix_caching},
    }


def model_info_body(state: ReplicaRuntime, s: ReplicaSettings) -> dict:
    """SGLang's ``/model_info``. There is no tokenizer file (``tokenizer_path`` is null): the
    built-in tokenizer (shared/tokenizer.py) is what ``/tokenize`` serves. No Hugging Face
    ``model_type`` or ``architectures`` either: kvemu's presets are sizes, not checkpoints."""
    name = served_model_name(s)
    m = state.cost.model
    return {
        "model_path": name, "served_model_name": name, "tokenizer_path": None, "is_generation": True,
        "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": False,
        "has_audio_understanding": False, "model_type": None, "architectures": None,
        "context_length": s.resolved_max_model_len(), "max_context_length": s.resolved_max_model_len(),
        "max_req_input_len": _max_req_input_len(s), "vocab_size": tokenizer.VOCAB_SIZE,
        "kvemu": {"model_preset": m.name, "layers": m.layers, "q_heads": m.q_heads, "kv_heads": m.kv_heads,
                  "head_dim": m.head_dim, "hidden": m.hidden, "vocab": m.vocab, "experts": m.experts,
                  "active_experts": m.active_experts, "dtype_bytes": m.dtype_bytes, "max_context": m.max_context,
                  "tokenizer": "kvemu built-in: words, numbers and punctuation hashed to ids (shared/tokenizer.py)"},
    }


async def server_info(request: web.Request) -> web.Response:
    return respond(request, server_info_body(_state(request), _settings(request)))


async def model_info(request: web.Request) -> web.Response:
    return respond(request, model_info_body(_state(request), _settings(request)))


def load_body(state: ReplicaRuntime, s: ReplicaSettings) -> list[dict]:
    """SGLang's ``/get_load``: one entry per data-parallel rank (``dp_rank`` None with one). ``num_tokens`` is
    SGLang's figure: KV tokens running requests hold (cached blocks no request holds excluded) plus the
    prompt tokens of the requests waiting to be admitted."""
    return [_rank_load(core, s.block_size, rank if len(state.cores) > 1 else None)
            for rank, core in enumerate(state.cores)]


def _rank_load(core, bs: int, rank: int | None) -> dict:
    sched, pool = core.scheduler, core.pool
    running, waiting = sched.num_running, sched.num_waiting
    held = (pool.pinned + pool.private) * bs
    waiting_tokens = sum(r.input_tokens for r in sched.waiting)
    total = pool.capacity * bs
    return {"dp_rank": rank, "num_reqs": running + waiting, "num_waiting_reqs": waiting,
            "num_tokens": held + waiting_tokens,
            # beyond SGLang's four: the parts, and the pool
            "num_running_reqs": running, "num_used_tokens": held, "num_waiting_tokens": waiting_tokens,
            "queued_prefill_tokens": sched.queued_prefill_tokens, "num_cached_tokens": pool.evictable * bs,
            "max_total_num_tokens": total, "token_usage": held / total, "kv_usage": pool.usage()}


async def get_load(request: web.Request) -> web.Response:
    return web.json_response(load_body(_state(request), _settings(request)))


async def health_generate(request: web.Request) -> web.Response:
    """SGLang's ``/health_generate``: a one-token generation through the engine (a one-token prompt,
    one output token, no session); 200 once it finishes, 503 when it cannot be queued or does not
    finish within ``HEALTH_GENERATE_TIMEOUT_S`` (a stuck engine, or one too far behind)."""
    state = _state(request)
    s = _settings(request)
    try:
        handle = state.engine.submit([], 1, 1, None, False)
    except KvemuError as exc:  # the queue is full, or the request could never run here
        return _unhealthy(f"the one-token health generation was refused: {exc}")
    try:
        async with asyncio.timeout(HEALTH_GENERATE_TIMEOUT_S):
            await asyncio.shield(handle.done)  # on a timeout the request still finishes in the engine
    except TimeoutError:
        return _unhealthy(f"the one-token health generation did not finish within {HEALTH_GENERATE_TIMEOUT_S:g} s"
                          f" ({state.scheduler.num_running} running, {state.scheduler.num_waiting} waiting)")
    return web.json_response({"status": "ok", "replica_id": s.replica_id, "output_tokens": handle.req.output_tokens,
                              **handle.timings()})


def _unhealthy(message: str) -> web.Response:
    return web.json_response(protocol.error_body(503, None, message), status=503, headers={"Retry-After": "1"})


# ---- vLLM: /tokenize, /detokenize, /version -------------------------------------------------------
def _chat_text(obj: dict) -> str:
    """The prompt ``/v1/chat/completions`` renders for the same messages and tools."""
    if protocol.bool_field(obj, "continue_final_message"):
        raise InputError("continue_final_message", "is not emulated; the chat template always closes the last message")
    if obj.get("chat_template") is not None:
        raise InputError("chat_template", "custom chat templates are not emulated; kvemu renders its own (ChatML-like)")
    text = tokenizer.chat_template(protocol._messages(obj.get("messages")), protocol._tools(obj))
    if not protocol.bool_field(obj, "add_generation_prompt", True):
        text = text[:-len(_GENERATION_PROMPT)]
    return text


async def _tokenize(text: str, field: str, limit: int, before: int = 0) -> tuple[list[int], list[str]]:
    """The ids and pieces of ``text``, refused (naming ``field``) past ``limit`` tokens, counting
    ``before`` tokens of earlier prompts of the same request."""
    ids: list[int] = []
    pieces: list[str] = []
    room = limit - before
    try:
        for tid, piece in tokenizer.tokenize(text):
            if len(ids) == room:
                raise InputError(field, f"takes the request past {limit} tokens; the limit is {limit}")
            ids.append(tid)
            pieces.append(piece)
            if len(ids) % _PACE == 0:
                await asyncio.sleep(0)  # a long text does not stall the other requests
    except UnicodeEncodeError:  # JSON allows a lone surrogate escape ("\\ud800"); text has none
        raise InputError(field, "holds a lone surrogate (\\ud800-\\udfff), which is not text") from None
    return ids, pieces


async def tokenize(request: web.Request) -> web.Response:
    """vLLM's ``/tokenize``: ``prompt`` (a string; SGLang's list of strings too) or ``messages``
    (rendered as ``/v1/chat/completions`` renders them, so ``count`` is its ``prompt_tokens``)."""
    s = _settings(request)
    obj = await read_body(request)
    protocol._str(obj, "model")  # any name is accepted, as the completion endpoints accept it
    protocol.bool_field(obj, "add_special_tokens")  # accepted; the built-in tokenizer has no special tokens
    strs = protocol.bool_field(obj, "return_token_strs")
    limit = s.serving.max_prompt_tokens
    has_prompt, has_messages = obj.get("prompt") is not None, obj.get("messages") is not None
    if has_prompt == has_messages:
        raise InputError("prompt", "give exactly one of prompt or messages")
    max_model_len = s.resolved_max_model_len()
    if has_messages:
        ids, pieces = await _tokenize(_chat_text(obj), "messages", limit)
        return respond(request, {"count": len(ids), "max_model_len": max_model_len, "tokens": ids,
                                 "token_strs": pieces if strs else None})
    prompt = obj["prompt"]
    if isinstance(prompt, str):
        ids, pieces = await _tokenize(prompt, "prompt", limit)
        return respond(request, {"count": len(ids), "max_model_len": max_model_len, "tokens": ids,
                                 "token_strs": pieces if strs else None})
    if not isinstance(prompt, list) or not prompt or not all(isinstance(p, str) for p in prompt):
        raise InputError("prompt", f"expected a string or a non-empty list of strings, got {type(prompt).__name__}")
    batch: list[tuple[list[int], list[str]]] = []
    total = 0
    for i, text in enumerate(prompt):  # SGLang's batch: one list of ids per prompt, under one limit
        batch.append(await _tokenize(text, f"prompt[{i}]", limit, total))
        total += len(batch[-1][0])
        if i % 4096 == 4095:
            await asyncio.sleep(0)  # many short prompts do not stall the other requests either
    return respond(request, {"count": [len(b[0]) for b in batch], "max_model_len": max_model_len,
                             "tokens": [b[0] for b in batch], "token_strs": [b[1] for b in batch] if strs else None})


async def detokenize(request: web.Request) -> web.Response:
    """vLLM's ``/detokenize`` (``prompt``; SGLang's ``text`` too). Ids are hashes of text pieces, so
    only ids this replica's ``/tokenize`` gave can be turned back into text (shared/tokenizer.py
    keeps id -> piece, bounded); any other id is a 400 naming its position. Where two pieces have
    had one id the latest is given, and ``kvemu.ambiguous`` counts those positions."""
    s = _settings(request)
    obj = await read_body(request)
    protocol._str(obj, "model")
    if obj.get("tokens") is None:
        raise InputError("tokens", "missing; expected a list of token ids")
    ids = protocol._token_list(obj["tokens"], "tokens", s.serving.max_prompt_tokens + s.serving.max_output_tokens)
    parts: list[str] = []
    shared: list[int] = []
    for start in range(0, len(ids), _PACE):
        text, unknown, ambiguous = tokenizer.decode(ids[start:start + _PACE])
        if unknown:
            i = start + unknown[0]
            why = (f"is outside the vocabulary [0, {tokenizer.VOCAB_SIZE})" if ids[i] >= tokenizer.VOCAB_SIZE else
                   "was never given by this replica's /tokenize (ids are hashes of text pieces, so only ids it gave"
                   " can be turned back into text)")
            raise InputError(f"tokens[{i}]", f"id {ids[i]} {why}")
        parts.append(text)
        shared += [start + j for j in ambiguous]
        if start:
            await asyncio.sleep(0)
    text = "".join(parts)
    return respond(request, {"prompt": text, "text": text,
                             "kvemu": {"ambiguous": len(shared), "ambiguous_positions": shared[:_SHOWN]}})


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": VERSION})


# ---- an HTTP/2 probe is one log line, not a traceback ------------------------------------------
class _Http2Probes(logging.Filter):
    """aiohttp logs the HTTP/2 preface a gRPC client opens with (sglang-router probes every worker
    over gRPC beside HTTP) as an error with a traceback; it has answered 400 already."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, BadHttpMessage) and "PRI" in str(exc):
            log.info("refused an HTTP/2 (gRPC) connection with 400: a replica serves HTTP/1.1 only")
            return False
        return True


def quiet_http2_probes() -> None:
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _Http2Probes) for f in server_log.filters):
        server_log.addFilter(_Http2Probes())


def add_routes(app: web.Application) -> None:
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, server_info)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, model_info)
    app.router.add_get("/get_load", get_load)
    app.router.add_get("/health_generate", health_generate)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_post("/detokenize", detokenize)
    app.router.add_get("/version", version)
    quiet_http2_probes()
