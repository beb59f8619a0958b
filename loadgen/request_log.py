"""Request logs: the OpenAI bodies an application sent, one JSON object a line, rendered to the
token ids the emulated server would see.

A line is either a body as sent, a chat-completions body (``messages``) or a completions body
(``prompt``), or a record that wraps one::

    {"timestamp": 1796121067.0, "session": "s-1", "headers": {"X-Session-Id": "s-1"}, "body": {...}}

where every key but ``body`` is optional. ``timestamp`` is seconds (a number) or an ISO 8601
string (``2026-12-01T10:31:07Z``; without a zone it is UTC). The session is the first of:

1. the record's ``session`` (or ``session_id``);
2. an ``x-session-id`` header (any case), a key of the line or of its ``headers`` object: what the
   emulated server reads as the session (``X-Session-Id``);
3. the body's ``metadata.session_id``;
4. the body's ``user`` (what the emulated server takes when the header is absent).

A request none of them names gets an inferred session (``session_given`` is then false), named
``inferred-N`` in order of first appearance: chat requests share one when their first user
message is the same text (a chat with no user message keys on its first message), so a system
prompt or tool list that changes between turns does not split a conversation; all session-less
completions form one session, each compared with the one before it in the log. The rule reads
the request alone, so it streams: ``iter_request_log`` holds one key per inferred session.

Bodies are checked as ``shared.protocol.parse_openai`` checks them, in its order and with its
messages (an option kvemu does not emulate is refused by name), and rendered with the server's
chat template, so a token position here is the position the server sees. The response
continuation ``parse_openai`` derives is not built (at a large ``max_tokens`` it costs more than
the prompt). Every problem is a ``TraceFormatError``: ``FILE:LINE: field 'F': what is wrong``.
"""

from __future__ import annotations

import gzip
import json
from array import array
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from typing import Any, NamedTuple

from loadgen.jsonlines import json_lines
from shared import protocol, tokenizer
from shared.errors import InputError, TraceFormatError

# The sample log shipped in the package (loadgen/data/README.md), usable by this name.
SAMPLE_LOG = "prompt-log-sample"
SAMPLE_FILE = "prompt_log_sample.jsonl"
# Far above any real prompt: a log is audited as sent, not against a model's window.
LIMITS = (1 << 30, 1 << 30)
_GENERATION = tokenizer.chat_template([])  # the template's closing "<|im_start|>assistant\n"


class Message(NamedTuple):
    """A message as the template renders it: tool calls and tool responses already folded in."""

    role: str
    content: str


class Span(NamedTuple):
    """One part of a rendered prompt, in order: the tool definitions, a message, the generation
    prompt (chat) or the whole prompt (completions)."""

    part: str  # "tools" | "message" | "generation" | "prompt"
    message: int  # the message's index in the body's messages (-1 for the other parts)
    role: str  # the message's role ("" for the other parts)
    token: int  # its first token (a token belongs to the part its first non-blank character is in)
    char: int  # its first character in the rendered text

    @property
    def label(self) -> str:
        if self.part == "message":
            return f"message {self.message} ({self.role})"
        return {"generation": "generation prompt"}.get(self.part, self.part)


@dataclass(slots=True)
class LoggedRequest:
    """One line of a request log, rendered."""

    line: int  # 1-based line number in the file
    timestamp: float | None  # seconds (epoch seconds for an ISO 8601 string), None when not logged
    session: str  # as given, or inferred ("inferred-N")
    session_given: bool
    kind: str  # "chat" | "completion"
    tokens: list[int]  # the prompt's token ids, as the emulated server renders and encodes it
    max_tokens: int  # max_completion_tokens, else max_tokens, else 16 (the server's default)
    text: str  # the rendered prompt ("" when a completions prompt was token ids)
    messages: list[Message] = field(default_factory=list)  # chat: the rendered messages
    tools: list | None = None  # chat: the tool definitions as sent (None: none)
    prompt: str | None = None  # completions: the prompt's text (None when it was token ids)
    _parts: list[Part] = field(default_factory=list, repr=False)  # the rendering's parts, in order
    _offsets: array | None = field(default=None, repr=False, compare=False)
    _spans: list[Span] | None = field(default=None, repr=False, compare=False)

    def offsets(self) -> array:
        """``offsets()[i]:offsets()[i + 1]`` is token i's piece of ``text`` (its leading blanks
        included): len(tokens) + 1 entries, none when there is no text. Worked out on first use
        (it costs as much as the encoding)."""
        if self._offsets is None:
            self._offsets = _offsets(self.text) if self.text else array("I")
        return self._offsets

    def spans(self) -> list[Span]:
        """The prompt's parts in order, each with its first token (worked out on first use)."""
        if self._spans is None:
            offsets = self.offsets()
            self._spans = [Span(*p[:3], _first_token_at(self.text, offsets, p.char) if offsets else 0, p.char)
                           for p in self._parts]
        return self._spans

    def span_at(self, position: int) -> Span:
        """The part token ``position`` falls in."""
        spans = self.spans()
        return spans[max(bisect_right([s.token for s in spans], position) - 1, 0)]

    def tools_text(self) -> str:
        """The tool definitions as rendered, their part's header included ("" for none)."""
        parts = self._parts
        return self.text[parts[0].char:parts[1].char] if len(parts) > 1 and parts[0].part == "tools" else ""

    def piece(self, position: int) -> str:
        """Token ``position``'s text (its leading blanks included); its id where there is no text."""
        offsets = self.offsets()
        if not offsets:
            return str(self.tokens[position])
        return self.text[offsets[position]:offsets[position + 1]]


class Part(NamedTuple):
    part: str
    message: int
    role: str
    char: int  # its first character in the rendered text


class Rendered(NamedTuple):
    text: str
    tokens: list[int]
    parts: list[Part]


@dataclass(slots=True)
class RequestLog:
    path: str
    requests: list[LoggedRequest]
    sessions_given: int
    sessions_inferred: int


# ---- rendering -------------------------------------------------------------------------------


def chat_parts(messages: list[Message], tools: str) -> list[tuple[str, int, str, str]]:
    """``(part, message index, role, text)`` for each part of ``shared.tokenizer.chat_template``'s
    rendering, in order: their texts concatenate to it exactly."""
    parts = [("tools", -1, "", tokenizer.chat_template([], tools)[:-len(_GENERATION)])] if tools else []
    for i, m in enumerate(messages):
        parts.append(("message", i, m.role, tokenizer.chat_template([m._asdict()])[:-len(_GENERATION)]))
    parts.append(("generation", -1, "", _GENERATION))
    return parts


def render_chat(messages: list[Message], tools: str) -> Rendered:
    """A chat prompt's text, token ids and parts (where each starts in the text), as the emulated server renders it (``tools``:
    the tool definitions' JSON as ``shared.protocol`` renders them, "" for none)."""
    parts = chat_parts(messages, tools)
    text = "".join(p[3] for p in parts)
    if text != tokenizer.chat_template([m._asdict() for m in messages], tools):
        raise AssertionError("the chat template is no longer a concatenation of its parts")
    starts, char = [], 0
    for part, index, role, piece in parts:
        starts.append(Part(part, index, role, char))
        char += len(piece)
    return Rendered(text, _encode(text, "messages"), starts)


def render_prompt(text: str) -> Rendered:
    return Rendered(text, _encode(text, "prompt"), [Part("prompt", -1, "", 0)])


def _encode(text: str, where: str) -> list[int]:
    try:
        return tokenizer.encode(text)
    except UnicodeEncodeError:  # as shared.protocol answers it
        raise InputError(where, "holds a lone surrogate (\\ud800-\\udfff), which is not text") from None


def _offsets(text: str) -> array:
    offsets, end = array("I", [0]), 0
    for _, piece in tokenizer.tokenize(text):
        end += len(piece)
        offsets.append(end)
    return offsets


def _first_token_at(text: str, offsets: array, char: int) -> int:
    """The first token whose first non-blank character is at or after ``char``."""
    i = max(bisect_right(offsets, char) - 1, 0)
    while i < len(offsets) - 1:
        start, stop = offsets[i], offsets[i + 1]
        core = start + len(text[start:stop]) - len(text[start:stop].lstrip())
        if core >= char:
            return i
        i += 1
    return len(offsets) - 1


# ---- one body --------------------------------------------------------------------------------


def parse_body(body: dict, header_session: str | None = None, render: bool = True) -> LoggedRequest:
    """A body checked as ``shared.protocol.parse_openai`` checks it (``InputError`` names what is
    wrong) and rendered: a ``LoggedRequest`` with line 0 and no session yet. ``render=False``
    leaves ``text``, its parts and a text's ``tokens`` empty (a caller that renders the messages
    its own way)."""
    chat, completion = "messages" in body, "prompt" in body
    if chat == completion:
        raise InputError("body", "has both messages and prompt; send one" if chat else
                         "expected an OpenAI chat body (messages) or completions body (prompt)")
    max_prompt, max_out = LIMITS
    max_tokens = protocol._int(body, "max_completion_tokens", None, 1, max_out)
    if max_tokens is None:
        max_tokens = protocol._int(body, "max_tokens", 16, 1, max_out)
    assert max_tokens is not None  # a default was given
    protocol._str(body, "model")
    protocol._include_usage(body, protocol.bool_field(body, "stream"))
    protocol._refuse_unemulated(body, chat)
    protocol._session(body, header_session)
    request = LoggedRequest(0, None, "", False, "chat" if chat else "completion", [], max_tokens, "")
    if chat:
        request.messages = [Message(m["role"], m["content"]) for m in protocol._messages(body["messages"])]
        request.tools = body.get("tools")
        tools = protocol._tools(body)
        if not render:
            return request
        rendered = render_chat(request.messages, tools)
    else:
        prompt = body["prompt"]
        tokens = protocol._prompt_tokens(prompt, max_prompt)
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]  # a batch of one, as the server unwraps it
        if isinstance(prompt, str):
            request.prompt = prompt
            rendered = render_prompt(prompt) if render else Rendered("", [], [])
        else:
            rendered = Rendered("", tokens, [Part("prompt", -1, "", 0)])
    request.text, request.tokens, request._parts = rendered
    return request


# ---- one line --------------------------------------------------------------------------------


def _timestamp(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError("timestamp", f"expected seconds or an ISO 8601 string, got {type(value).__name__}")
    if isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise InputError("timestamp", f"not an ISO 8601 time: {value!r:.60}") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return moment.timestamp()
    if value != value or value in (float("inf"), float("-inf")):
        raise InputError("timestamp", f"must be a finite number, got {value}")
    return float(value)


def _header_session(record: dict) -> str | None:
    headers = record.get("headers")
    if headers is not None and not isinstance(headers, dict):
        raise InputError("headers", f"expected an object, got {type(headers).__name__}")
    for where in (record, headers or {}):
        for key, value in where.items():
            if isinstance(key, str) and key.lower() == "x-session-id" and value is not None:
                if not isinstance(value, str):
                    raise InputError(key, f"expected a string, got {type(value).__name__}")
                return value or None
    return None


def _given_session(record: dict, body: dict, header: str | None, prefix: str) -> str | None:
    if record is not body:
        for key in ("session", "session_id"):
            value = record.get(key)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, (str, int)):
                    raise InputError(key, f"expected a string, got {type(value).__name__}")
                if str(value):
                    return str(value)
    if header:
        return header
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and metadata.get("session_id") is not None:
        value = metadata["session_id"]
        if not isinstance(value, str):
            raise InputError(prefix + "metadata.session_id", f"expected a string, got {type(value).__name__}")
        if value:
            return value
    return protocol._session(body, None)


def parse_record(record: dict, line: int, render: bool = True) -> LoggedRequest:
    """One line's object (a body, or a record wrapping one), its session as given (or "")."""
    body = record.get("body", record) if "messages" not in record and "prompt" not in record else record
    if not isinstance(body, dict):
        raise InputError("body", f"expected an object, got {type(body).__name__}")
    header = _header_session(record)
    prefix = "" if body is record else "body."
    try:
        request = parse_body(body, header, render)
    except InputError as exc:
        raise InputError(exc.field if exc.field == "body" else prefix + exc.field, exc.message) from None
    request.line = line
    request.timestamp = _timestamp(record.get("timestamp")) if body is not record else None
    given = _given_session(record, body, header, prefix)
    request.session, request.session_given = given or "", given is not None
    return request


def inference_key(request: LoggedRequest) -> str | None:
    """What a session-less request is grouped by: its first user message (else its first message)
    for a chat; None (one session for them all) for completions."""
    if request.kind != "chat":
        return None
    first = next((m for m in request.messages if m.role == "user"), request.messages[0])
    return first.content


# ---- a file ----------------------------------------------------------------------------------


def resolve_log(path: str | Path) -> str:
    """The file behind ``path``: ``prompt-log-sample`` (when no such file exists) is the shipped sample."""
    p = str(path)
    if p == SAMPLE_LOG and not Path(p).exists():
        return str(files("loadgen.data").joinpath(SAMPLE_FILE))
    return p


def _open(path: str):
    try:
        fh = open(path, "rb")
    except FileNotFoundError:
        raise InputError("log", f"no file {path}; give a request log's path, or {SAMPLE_LOG} for the sample") from None
    except OSError as exc:
        raise InputError("log", f"cannot read {path}: {exc.strerror or exc}") from None
    return gzip.GzipFile(fileobj=fh, mode="rb") if path.endswith(".gz") else fh


def iter_records(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) of each non-blank line; a bad line is a ``TraceFormatError``."""
    p = resolve_log(path)
    return json_lines(p, _open(p), _decode)


def _decode(p: str, lineno: int, raw: bytes) -> dict:
    """A line as the server decodes a body (exact JSON, bounded nesting); not an object is the caller's."""
    try:
        return protocol.decode_body(raw, "application/json")
    except InputError as exc:
        raise TraceFormatError(p, lineno, "line", exc.message) from None


def iter_request_log(path: str | Path, render: bool = True) -> Iterator[LoggedRequest]:
    """Each request of the log in file order, sessions given or inferred (see the module's doc);
    ``render``: as ``parse_body``'s."""
    p = resolve_log(path)
    inferred: dict[str | None, str] = {}
    empty = True
    for lineno, record in iter_records(p):
        empty = False
        try:
            request = parse_record(record, lineno, render)
        except InputError as exc:
            raise TraceFormatError(p, lineno, exc.field, exc.message) from None
        except RecursionError:  # a JSON nesting the decoder takes but a renderer does not
            raise TraceFormatError(p, lineno, "line", "nested too deeply") from None
        if not request.session_given:
            key = inference_key(request)
            if key not in inferred:
                inferred[key] = f"inferred-{len(inferred) + 1}"
            request.session = inferred[key]
        yield request
    if empty:
        raise InputError("log", f"{p} holds no requests (the file is empty or every line is blank)")


def read_request_log(path: str | Path) -> RequestLog:
    """The whole log in memory (``iter_request_log`` streams it)."""
    requests = list(iter_request_log(path))
    given = {r.session for r in requests if r.session_given}
    inferred = {r.session for r in requests if not r.session_given}
    return RequestLog(str(path), requests, len(given), len(inferred))


def tools_json(tools: list | None, canonical: bool = False) -> str:
    """Tool definitions as the server renders them; ``canonical``: each tool's keys sorted and the
    tools in the order of their sorted JSON (one order for the same set, however it was sent)."""
    if not canonical or not tools:
        return protocol._tools({"tools": tools})
    return "[" + ",".join(sorted(json.dumps(t, sort_keys=True, separators=(",", ":")) for t in tools)) + "]"
