"""Wire parsing and validation for the replica's (and router's) HTTP API.

Bodies are JSON or msgpack (``Content-Type: application/msgpack``). Every problem
becomes an ``InputError`` naming the field, which the app answers with a 4xx JSON error.
The names both sides of the wire spell (kvemu's ``X-Kvemu-*`` headers, vLLM's ``kv_transfer_params``
and their parsing, SGLang's bootstrap fields) are defined here once.
"""

from __future__ import annotations

import json
import math
import re
from array import array
from dataclasses import dataclass
from typing import Any

import msgpack
import orjson

from shared import tokenizer
from shared.errors import InputError
from shared.hashing import ROOT_HASH, block_hashes

MSGPACK = "application/msgpack"
# A router's request header: answer a non-streamed request's status and headers at its first token, as a stream
# does, and its body at the end, so that the router's load count sees the prefill end (router/strategies/step.py)
HEAD_AT_FIRST_TOKEN = "X-Kvemu-Head-At-First-Token"
REPLICA_HEADER = "X-Kvemu-Replica"  # an answer's: the replica that served it
CACHED_TOKENS_HEADER = "X-Kvemu-Cached-Tokens"  # an answer's: the prompt tokens found cached where it was prefilled
ROUTE_REASON_HEADER = "X-Kvemu-Route-Reason"  # the router's answer: why it chose that replica
PD_PATH_HEADER = "X-Kvemu-Pd"  # the router's answer in a P/D cluster: how the prompt was prefilled
PREFILL_REPLICA_HEADER = "X-Kvemu-Prefill-Replica"  # ... and where, after a remote prefill
HOLD_NAME = "X-Kvemu-Hold-Id"  # the name kvemu's router gives a prefill leg, which its release names
DP_RANK_HEADER = "X-data-parallel-rank"  # vLLM's: the data-parallel rank of the engine a request goes to
KV_PARAMS = "kv_transfer_params"  # vLLM's P/D field (KvTransferParams)
TRANSFER_TOKEN = "kvemu_transfer_token"  # a hold's own credential, in its kv_transfer_params (replica/pd.py)
BOOTSTRAP_FIELDS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")  # SGLang's P/D wire (replica/sglang_pd.py)
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
MAX_U64 = 2**64 - 1
_U32 = next(code for code in "IL" if array(code).itemsize == 4)  # an array of unsigned 32-bit ints
# A msgpack float64 (0xcb) or float32 (0xca) whose exponent bits are all ones: NaN or an infinity. A
# match may also be bytes inside a string or an integer; then the decoded body is looked through.
_MSGPACK_NON_FINITE = re.compile(rb"\xcb[\x7f\xff][\xf0-\xff]|\xca[\x7f\xff][\x80-\xff]")


@dataclass(slots=True)
class GenerateSpec:
    """A parsed request, whatever endpoint it came through."""

    hashes: list[int]
    prompt_tokens: int
    max_tokens: int
    session: str | None
    stream: bool
    kind: str  # "generate" | "completion" | "chat"
    model: str = "kvemu"
    include_usage: bool = False
    # Hashes of the full blocks the response completes, chained after the prompt, when they can
    # be known: what a replica that keeps response KV caches (None: it cannot keep them).
    response_hashes: list[int] | None = None
    # The token ids the blocks of ``hashes`` then ``response_hashes`` cover, where the request carried
    # tokens (None: only block hashes): what vLLM's KV events publish (replica.vllm_events).
    block_tokens: list[int] | None = None


def decode_body(raw: bytes, content_type: str) -> dict:
    """A JSON or msgpack object. A number that is NaN or infinite anywhere in it (``NaN``,
    ``Infinity``, ``1e400``, or a msgpack float) is a 400 naming its field: no field takes one."""
    if not raw:
        raise InputError("body", "is empty; expected a JSON or msgpack object")
    if content_type.startswith(MSGPACK) or content_type.startswith("application/x-msgpack"):
        try:
            obj = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types
            raise InputError("body", f"malformed msgpack ({type(exc).__name__})") from None
        suspect = _MSGPACK_NON_FINITE.search(raw) is not None
    else:
        try:
            obj, suspect = orjson.loads(raw), False  # orjson refuses NaN, Infinity and 1e400: none here
        except orjson.JSONDecodeError:  # 2-3x the standard decoder; what it refuses gets the exact answer below
            obj, suspect = _decode_json_exactly(raw)
    if not isinstance(obj, dict):
        raise InputError("body", f"expected an object, got {type(obj).__name__}")
    if suspect:
        _refuse_non_finite(obj)
    return obj


def _refuse_non_finite(obj: dict) -> None:
    """The first NaN or infinite number in ``obj`` (in the body's order), as a 400 naming where it is."""
    todo: list[tuple[Any, str]] = [(obj, "")]
    while todo:  # a loop, not recursion: a body may nest as deep as its decoder allows
        value, path = todo.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                shown = "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
                raise InputError(path or "body", f"is {shown}; send a finite number (JSON has no NaN or Infinity)")
        elif isinstance(value, dict):
            todo.extend(reversed([(v, f"{path}.{k}" if path else str(k)[:64]) for k, v in value.items()]))
        elif isinstance(value, list):
            todo.extend(reversed([(v, f"{path}[{i}]") for i, v in enumerate(value) if type(v) in (float, dict, list)]))


def _decode_json_exactly(raw: bytes) -> tuple[Any, bool]:
    """The standard decoder, for what orjson refuses but JSON allows (integers beyond 64 bits,
    lone surrogates, NaN and numbers too large for a float, which are then refused by name), and for
    the error message that names the problem. Also says whether a number was NaN or infinite."""
    non_finite: list[str] = []

    def constant(text: str) -> float:  # NaN, Infinity, -Infinity
        non_finite.append(text)
        return float(text)

    def number(text: str) -> float:
        value = float(text)
        if not math.isfinite(value):  # 1e400
            non_finite.append(text)
        return value

    try:
        return json.loads(raw, parse_constant=constant, parse_float=number), bool(non_finite)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError("body", f"malformed JSON ({getattr(exc, 'msg', exc)})") from None
    except RecursionError:
        raise InputError("body", "nested too deeply") from None


def _int(obj: dict, name: str, default: int | None, lo: int, hi: int) -> int | None:
    value = obj.get(name)
    if value is None:  # absent or null (OpenAI's optional fields are nullable): the default
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(name, f"expected an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise InputError(name, f"must be between {lo} and {hi}, got {value}")
    return value


def bool_field(obj: dict, name: str, default: bool = False) -> bool:
    """``obj[name]`` as a JSON boolean (missing or null: ``default``); anything else names the field."""
    value = obj.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InputError(name, f"expected true or false, got {value!r:.40}")
    return value


def _str(obj: dict, name: str, limit: int = 256) -> str | None:
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InputError(name, f"expected a string, got {type(value).__name__}")
    if len(value) > limit:
        raise InputError(name, f"longer than {limit} characters")
    return value


def _token_list(value: Any, name: str, max_tokens: int) -> list[int]:
    if not isinstance(value, list):
        raise InputError(name, f"expected a list of integers, got {type(value).__name__}")
    if len(value) > max_tokens:
        raise InputError(name, f"has {len(value)} tokens; the limit is {max_tokens}")
    if set(map(type, value)) <= {int}:
        try:
            array(_U32, value)  # the range check, in C (half the time of min and max)
            return value  # the common case; the loop below names the first bad id
        except OverflowError:
            pass
    for i, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < 2**32:
            raise InputError(f"{name}[{i}]", f"expected a token id in [0, 2**32), got {t!r:.40}")
    return value


def _hash_list(value: Any, name: str, max_blocks: int) -> list[int]:
    if not isinstance(value, list):
        raise InputError(name, f"expected a list of 64-bit hashes, got {type(value).__name__}")
    if len(value) > max_blocks:
        raise InputError(name, f"has {len(value)} blocks; the limit is {max_blocks}")
    for i, h in enumerate(value):
        if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h <= MAX_U64:
            raise InputError(f"{name}[{i}]", f"expected an unsigned 64-bit integer, got {h!r:.40}")
    if len(set(value)) != len(value):
        raise InputError(name, "a block hash repeats; chained hashes never do")
    return value


def _session(obj: dict, header_session: str | None) -> str | None:
    session = header_session if header_session else _str(obj, "user")
    if session is not None and len(session) > 256:
        raise InputError("X-Session-Id", "longer than 256 characters")
    return session or None


def parse_generate(obj: dict, block_size: int, limits: tuple[int, int], header_session: str | None) -> GenerateSpec:
    """``POST /generate``: ``token_ids`` or ``block_hashes`` (+ optional ``input_tokens``)."""
    max_prompt, max_out = limits
    max_tokens = _int(obj, "max_tokens", None, 1, max_out)
    if max_tokens is None:
        max_tokens = _int(obj, "output_tokens", 1, 1, max_out)
    assert max_tokens is not None  # a default was given
    session = _session(obj, header_session) or _str(obj, "session")
    stream = bool_field(obj, "stream")
    has_tokens, has_hashes = "token_ids" in obj, "block_hashes" in obj
    if has_tokens == has_hashes:
        raise InputError("token_ids", "give exactly one of token_ids or block_hashes")
    if has_tokens:
        tokens = _token_list(obj["token_ids"], "token_ids", max_prompt)
        hashes = block_hashes(tokens, block_size)
        if obj.get("response_token_ids") is None:
            return GenerateSpec(hashes, len(tokens), max_tokens, session, stream, "generate", block_tokens=tokens)
        # A trace-driven client may say what the response's tokens will be (its next turn's): the full
        # blocks they complete after the prompt's are what a replica that keeps response KV caches.
        whole = tokens + _token_list(obj["response_token_ids"], "response_token_ids", max_out)
        return GenerateSpec(hashes, len(tokens), max_tokens, session, stream, "generate",
                            response_hashes=block_hashes(whole, block_size)[len(hashes):], block_tokens=whole)
    hashes = _hash_list(obj["block_hashes"], "block_hashes", max_prompt // block_size)
    prompt_tokens = _int(obj, "input_tokens", len(hashes) * block_size, 0, max_prompt)
    assert prompt_tokens is not None  # a default was given
    if prompt_tokens < len(hashes) * block_size:
        raise InputError("input_tokens", f"{prompt_tokens} is fewer than {len(hashes)} full blocks hold")
    response = None  # a trace-driven client may say what the response's blocks hash to (its next turn)
    if obj.get("response_block_hashes") is not None:
        response = _hash_list(obj["response_block_hashes"], "response_block_hashes", max_out // block_size + 1)
    return GenerateSpec(hashes, prompt_tokens, max_tokens, session, stream, "generate", response_hashes=response)


def _encode(text: str, field: str) -> list[int]:
    try:
        return tokenizer.encode(text)
    except UnicodeEncodeError:  # JSON allows a lone surrogate escape ("\ud800"); text has none
        raise InputError(field, "holds a lone surrogate (\\ud800-\\udfff), which is not text") from None


def _prompt_tokens(prompt: Any, max_prompt: int, unwrapped: bool = False) -> list[int]:
    if isinstance(prompt, str):
        tokens = _encode(prompt, "prompt")
    elif not unwrapped and isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        return _prompt_tokens(prompt[0], max_prompt, True)  # a batch of one is one prompt (one level only)
    elif not unwrapped and isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise InputError("prompt", f"is a batch of {len(prompt)} prompts; batches are not supported,"
                                   " send one prompt per request")
    elif isinstance(prompt, list):
        tokens = _token_list(prompt, "prompt", max_prompt)
    else:
        raise InputError("prompt", "expected a string or a list of token ids")
    if len(tokens) > max_prompt:
        raise InputError("prompt", f"has {len(tokens)} tokens; the limit is {max_prompt}")
    return tokens


def _content(content: Any, where: str) -> str:
    """A message's content: a string, null (an assistant turn made only of tool calls) or text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise InputError(where, f"expected a string, a list of content parts or null, got {type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict):
            raise InputError(f"{where}[{j}]", "expected a content part object")
        kind = part.get("type", "text")
        if kind not in ("text", "input_text", "refusal"):
            raise InputError(f"{where}[{j}].type", f"{kind!r:.40} parts are not emulated; kvemu serves text only")
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise InputError(f"{where}[{j}].text", "expected a string")
        texts.append(text)
    return "".join(texts)


def _tool_calls(calls: Any, where: str) -> str:
    """Tool calls an assistant made, rendered as JSON so the same history renders the same text."""
    if calls is None:
        return ""
    if not isinstance(calls, list):
        raise InputError(where, f"expected a list of tool calls, got {type(calls).__name__}")
    for j, call in enumerate(calls):
        if not isinstance(call, dict):
            raise InputError(f"{where}[{j}]", "expected a tool call object")
    return "<tool_call>" + _render_json(calls, where, sort_keys=True) + "</tool_call>"


def _messages(value: Any) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise InputError("messages", "expected a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise InputError(f"messages[{i}]", "expected an object")
        role = m.get("role")
        if role not in ("system", "user", "assistant", "tool", "developer", "function"):
            raise InputError(f"messages[{i}].role", f"unknown role {role!r:.40}")
        content = _content(m.get("content"), f"messages[{i}].content")
        if role == "assistant":
            content += _tool_calls(m.get("tool_calls"), f"messages[{i}].tool_calls")
        elif role in ("tool", "function"):
            call_id = m.get("tool_call_id") or m.get("name") or ""
            content = f"<tool_response id={str(call_id)[:64]}>{content}</tool_response>"
        out.append({"role": role, "content": content})
    return out


def _tools(obj: dict) -> str:
    """Tool definitions are part of the prompt a real server renders; so they are here.

    In the client's order, keys included: real chat templates render them with ``tojson``, which
    keeps the order it was sent in (Hugging Face's, as vLLM and SGLang apply them), so tools or
    keys sent in another order are another prompt there. Sorting them here made a reordering free,
    which no real server gives (``kvemu audit`` finds where a log pays for it)."""
    tools = obj.get("tools")
    if tools is None:
        return ""
    if not isinstance(tools, list):
        raise InputError("tools", f"expected a list of tool definitions, got {type(tools).__name__}")
    return _render_json(tools, "tools")


def _render_json(value: Any, where: str, sort_keys: bool = False) -> str:
    """Compact JSON as a template renders it. A nesting the decoder takes (its limit is 1,024 levels)
    can still be too deep to encode again: a 400 naming the field, not a RecursionError."""
    try:
        return json.dumps(value, sort_keys=sort_keys, separators=(",", ":"))
    except RecursionError:
        raise InputError(where, "is nested too deeply to render; flatten it") from None


def _refuse_unemulated(obj: dict, chat: bool) -> None:
    """Options that would change what comes back, which kvemu does not emulate: refused by name."""
    n = obj.get("n")
    if n is not None and n != 1:
        raise InputError("n", f"only n=1 is emulated, got {n!r:.40}")
    for name in ("best_of",):
        if obj.get(name) not in (None, 1):
            raise InputError(name, "only one candidate is emulated; drop the option or set it to 1")
    stop = obj.get("stop")
    if stop not in (None, "", []):
        raise InputError("stop", "stop sequences are not emulated (outputs always run to max_tokens)")
    logprobs = obj.get("logprobs")
    if logprobs not in (None, False) or obj.get("top_logprobs") not in (None, 0):
        raise InputError("logprobs" if logprobs not in (None, False) else "top_logprobs",
                         "log probabilities are not emulated")
    if not chat and obj.get("echo"):
        raise InputError("echo", "echoing the prompt is not emulated")
    if not chat and obj.get("suffix"):
        raise InputError("suffix", "insertion (suffix) is not emulated")
    fmt = obj.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
        raise InputError("response_format", f"{fmt.get('type')!r:.40} output is not emulated; only text")


def _include_usage(obj: dict, stream: bool) -> bool:
    opts = obj.get("stream_options")
    if opts is None:
        return False
    if not isinstance(opts, dict):
        raise InputError("stream_options", "expected an object")
    if not stream:
        raise InputError("stream_options", "only allowed when stream is true")
    value = opts.get("include_usage", False)
    if not isinstance(value, bool):
        raise InputError("stream_options.include_usage", f"expected true or false, got {value!r:.40}")
    return value


def parse_openai(obj: dict, chat: bool, block_size: int, limits: tuple[int, int],
                 header_session: str | None) -> GenerateSpec:
    max_prompt, max_out = limits
    max_tokens = _int(obj, "max_completion_tokens", None, 1, max_out)
    if max_tokens is None:
        max_tokens = _int(obj, "max_tokens", 16, 1, max_out)
    assert max_tokens is not None  # a default was given
    model = _str(obj, "model") or "kvemu"
    stream = bool_field(obj, "stream")
    include_usage = _include_usage(obj, stream)
    _refuse_unemulated(obj, chat)
    if chat:
        text = tokenizer.chat_template(_messages(obj.get("messages")), _tools(obj))
        tokens = _encode(text, "messages")
        if len(tokens) > max_prompt:
            raise InputError("messages", f"render to {len(tokens)} tokens; the limit is {max_prompt}")
    else:
        if "prompt" not in obj:
            raise InputError("prompt", "missing")
        tokens = _prompt_tokens(obj["prompt"], max_prompt)
    hashes = block_hashes(tokens, block_size)
    continuation = _continuation(tokens, hashes, max_tokens, chat)
    return GenerateSpec(hashes, len(tokens), max_tokens, _session(obj, header_session), stream,
                        "chat" if chat else "completion", model, include_usage,
                        block_hashes(continuation[len(hashes) * block_size:], block_size, hashes[-1] if hashes else ROOT_HASH),
                        continuation)


def response_seed(hashes: list[int], prompt_tokens: int) -> int:
    """The seed of a prompt's emulated response words: the same prompt gets the same words."""
    return (hashes[-1] if hashes else prompt_tokens) % 1_000_003


def _continuation(tokens: list[int], hashes: list[int], max_tokens: int, chat: bool) -> list[int]:
    """What a client continuing the conversation will send: the prompt, the response, and (chat) the
    end of the assistant turn, as the chat template renders the next turn. Its full blocks past the
    prompt's are the response's blocks (``GenerateSpec.response_hashes``)."""
    text = tokenizer.filler_text(max_tokens, response_seed(hashes, len(tokens)))
    # The template ends "assistant\n", and the tokenizer glues leading whitespace to the next
    # word, so the continuation's tokens are the prompt's followed by these.
    more = tokenizer.encode("\n" + text + "<|im_end|>\n") if chat else tokenizer.encode(text)
    return tokens + more


def error_body(status: int, field: str | None, message: str) -> dict:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": field, "code": status}}


# ---- kv_transfer_params: vLLM's P/D wire (replica/pd.py drives it, router/pd_legs.py sends it) -------------------
@dataclass(frozen=True, slots=True)
class KvTransferParams:
    """A request's ``kv_transfer_params`` (vLLM's field names; others are ignored, as vLLM ignores them)."""

    do_remote_decode: bool = False
    do_remote_prefill: bool = False
    remote_engine_id: str | None = None
    remote_host: str | None = None
    remote_port: int | None = None
    remote_request_id: str | None = None
    remote_block_ids: tuple[int, ...] = ()
    tp_size: int | None = None
    transfer_token: str | None = None  # the hold's credential its prefill instance issued (kvemu's; others have none)


def transfer_params(raw: bytes, content_type: str) -> KvTransferParams | None:
    """The body's ``kv_transfer_params`` (None: absent or null); the body is decoded again only when
    it names them, so a plain request pays one substring search."""
    if KV_PARAMS.encode() not in raw:
        return None
    return parse_params(decode_body(raw, content_type).get(KV_PARAMS))


def _param(obj: dict, name: str, kind: type, what: str) -> Any:
    value = obj.get(name)
    if value is None:
        return None
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
        raise InputError(f"{KV_PARAMS}.{name}", f"expected {what}, got {value!r:.60}")
    return value


def _block_ids(value: Any) -> tuple[int, ...]:
    """A list of block ids, or (vLLM with several KV cache groups) a list of such lists, flattened."""
    if value is None:
        return ()
    name = f"{KV_PARAMS}.remote_block_ids"
    if not isinstance(value, list | tuple):
        raise InputError(name, f"expected a list of integers, got {type(value).__name__}")
    flat = [x for group in value for x in (group if isinstance(group, list | tuple) else (group,))]
    for i, x in enumerate(flat):
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            raise InputError(f"{name}[{i}]", f"expected a block id (an integer >= 0), got {x!r:.40}")
    return tuple(flat)


def _transfer_token(value: Any) -> str | None:
    """A hold's credential as a prefill instance issues it (``secrets.token_urlsafe``): it goes in a header."""
    if value is None:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= 128 or not _TOKEN_CHARS.issuperset(value):
        raise InputError(f"{KV_PARAMS}.{TRANSFER_TOKEN}", "expected the token a prefill answer's kv_transfer_params"
                                                          " gave (letters, digits, - and _), passed on as it was")
    return value


def parse_params(value: Any) -> KvTransferParams | None:
    """``kv_transfer_params`` checked field by field: a 400 naming the field, before anything is pinned."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InputError(KV_PARAMS, f"expected an object, got {type(value).__name__}")
    decode = _param(value, "do_remote_decode", bool, "true or false") or False
    prefill = _param(value, "do_remote_prefill", bool, "true or false") or False
    if decode and prefill:
        raise InputError(f"{KV_PARAMS}.do_remote_prefill", "a request is prefilled here for a remote decode"
                         " (do_remote_decode) or decoded here after a remote prefill (do_remote_prefill), not both")
    port = _param(value, "remote_port", int, "a port number")
    if port is not None and not 1 <= port <= 65535:
        raise InputError(f"{KV_PARAMS}.remote_port", f"must be 1-65535, got {port}")
    tp = _param(value, "tp_size", int, "an integer >= 1")
    if tp is not None and tp < 1:
        raise InputError(f"{KV_PARAMS}.tp_size", f"must be >= 1, got {tp}")
    engine = value.get("remote_engine_id")
    if engine is not None and (isinstance(engine, bool) or not isinstance(engine, str | int)):
        raise InputError(f"{KV_PARAMS}.remote_engine_id", f"expected a string, got {engine!r:.60}")
    params = KvTransferParams(decode, prefill, None if engine is None else str(engine),
                              _param(value, "remote_host", str, "a host name or address"), port,
                              _param(value, "remote_request_id", str, "a string"),
                              _block_ids(value.get("remote_block_ids")), tp,
                              _transfer_token(value.get(TRANSFER_TOKEN)))
    if prefill:
        for name in ("remote_host", "remote_port", "remote_request_id"):
            if not getattr(params, name):
                raise InputError(f"{KV_PARAMS}.{name}", "missing: do_remote_prefill needs the prefill instance's"
                                 " remote_host, remote_port and remote_request_id (its answer's kv_transfer_params)")
    return params
