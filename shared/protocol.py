"""Wire parsing and validation for the replica's (and router's) HTTP API.

Bodies are JSON or msgpack (``Content-Type: application/msgpack``). Every problem
becomes an ``InputError`` naming the field, which the app answers with a 4xx JSON error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgpack

from shared import tokenizer
from shared.errors import InputError
from shared.hashing import block_hashes

MSGPACK = "application/msgpack"
MAX_U64 = 2**64 - 1


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


def decode_body(raw: bytes, content_type: str) -> dict:
    if not raw:
        raise InputError("body", "is empty; expected a JSON or msgpack object")
    if content_type.startswith(MSGPACK) or content_type.startswith("application/x-msgpack"):
        try:
            obj = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several unrelated types
            raise InputError("body", f"malformed msgpack ({type(exc).__name__})") from None
    else:
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InputError("body", f"malformed JSON ({getattr(exc, 'msg', exc)})") from None
        except RecursionError:
            raise InputError("body", "nested too deeply") from None
    if not isinstance(obj, dict):
        raise InputError("body", f"expected an object, got {type(obj).__name__}")
    return obj


def _int(obj: dict, name: str, default: int | None, lo: int, hi: int) -> int | None:
    value = obj.get(name)
    if value is None:  # absent or null (OpenAI's optional fields are nullable): the default
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(name, f"expected an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise InputError(name, f"must be between {lo} and {hi}, got {value}")
    return value


def _bool(obj: dict, name: str) -> bool:
    value = obj.get(name)
    if value is None:
        return False
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
    if set(map(type, value)) <= {int} and (not value or (min(value) >= 0 and max(value) < 2**32)):
        return value  # the common case, checked in C; the loop below names the first bad id
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
    session = _session(obj, header_session) or _str(obj, "session")
    stream = _bool(obj, "stream")
    has_tokens, has_hashes = "token_ids" in obj, "block_hashes" in obj
    if has_tokens == has_hashes:
        raise InputError("token_ids", "give exactly one of token_ids or block_hashes")
    if has_tokens:
        tokens = _token_list(obj["token_ids"], "token_ids", max_prompt)
        return GenerateSpec(block_hashes(tokens, block_size), len(tokens), max_tokens, session, stream, "generate")
    hashes = _hash_list(obj["block_hashes"], "block_hashes", max_prompt // block_size)
    prompt_tokens = _int(obj, "input_tokens", len(hashes) * block_size, 0, max_prompt)
    if prompt_tokens < len(hashes) * block_size:
        raise InputError("input_tokens", f"{prompt_tokens} is fewer than {len(hashes)} full blocks hold")
    return GenerateSpec(hashes, prompt_tokens, max_tokens, session, stream, "generate")


def _prompt_tokens(prompt: Any, max_prompt: int) -> list[int]:
    if isinstance(prompt, str):
        tokens = tokenizer.encode(prompt)
    elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        tokens = tokenizer.encode(prompt[0])
    elif isinstance(prompt, list):
        tokens = _token_list(prompt, "prompt", max_prompt)
    else:
        raise InputError("prompt", "expected a string or a list of token ids")
    if len(tokens) > max_prompt:
        raise InputError("prompt", f"has {len(tokens)} tokens; the limit is {max_prompt}")
    return tokens


def _messages(value: Any) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise InputError("messages", "expected a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise InputError(f"messages[{i}]", "expected an object")
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "user", "assistant", "tool", "developer"):
            raise InputError(f"messages[{i}].role", f"unknown role {role!r:.40}")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = "".join(_part_text(p, f"messages[{i}].content[{j}]") for j, p in enumerate(content))
        if not isinstance(content, str):
            raise InputError(f"messages[{i}].content", "expected a string")
        out.append({"role": role, "content": content})
    return out


def _part_text(part: Any, name: str) -> str:
    if not isinstance(part, dict):
        raise InputError(name, f"expected a content part object, got {type(part).__name__}")
    text = part.get("text")
    if text is None:
        return ""
    if not isinstance(text, str):
        raise InputError(f"{name}.text", f"expected a string, got {type(text).__name__}")
    return text


def parse_openai(obj: dict, chat: bool, block_size: int, limits: tuple[int, int],
                 header_session: str | None) -> GenerateSpec:
    max_prompt, max_out = limits
    max_tokens = _int(obj, "max_completion_tokens", None, 1, max_out)
    if max_tokens is None:
        max_tokens = _int(obj, "max_tokens", 16, 1, max_out)
    model = _str(obj, "model") or "kvemu"
    stream = _bool(obj, "stream")
    opts = obj.get("stream_options") or {}
    if not isinstance(opts, dict):
        raise InputError("stream_options", "expected an object")
    include_usage = bool(opts.get("include_usage", False))
    if chat:
        tokens = tokenizer.encode(tokenizer.chat_template(_messages(obj.get("messages"))))
        if len(tokens) > max_prompt:
            raise InputError("messages", f"render to {len(tokens)} tokens; the limit is {max_prompt}")
    else:
        if "prompt" not in obj:
            raise InputError("prompt", "missing")
        tokens = _prompt_tokens(obj["prompt"], max_prompt)
    return GenerateSpec(block_hashes(tokens, block_size), len(tokens), max_tokens,
                        _session(obj, header_session), stream, "chat" if chat else "completion", model, include_usage)


def error_body(status: int, field: str | None, message: str) -> dict:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": field, "code": status}}
