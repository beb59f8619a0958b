"""A prompt-cache audit of a request log (``kvemu audit``): how much of each prompt a prefix cache
could reuse, where consecutive requests of a session part, why, and what moving the parts that
vary after the parts that do not would give.

The model is exact and small, so a log's figures can be worked by hand:

* Each request is rendered as the emulated server renders it (``loadgen.request_log``).
* A session's first request finds nothing cached (no prefix is assumed shared across sessions,
  not even a common system prompt). Every later request finds the previous request of its
  session cached, its prompt only: not the response, so a next turn that carries the reply
  gains nothing for it (and loses nothing: the reply follows the previous prompt's end).
* ``common``: the number of leading tokens the two prompts share. What is cached under a mode:
  ``blocks-B`` (vLLM's prefix caching: only full blocks of B tokens are hashed, so a partial
  last block is never reused): ``min(common, len(previous)) // B * B``; ``radix-P`` (SGLang's
  radix tree, page size P): ``common // P * P``. Against one previous prompt the two agree at
  B = P (``common`` never exceeds the previous prompt's length); they are kept apart because
  they name different servers' rules.
* Token hit ratio = the sum over requests of cached tokens / the sum of prompt tokens. The
  headline is ``blocks-16`` (vLLM's default block size, and kvemu's); ``blocks-1024`` is the
  coarse end where commercial APIs cache (nothing under 1,024 tokens: OpenAI caches prompts from
  1,024 tokens on, in steps of 128 past that, so this is a lower bound of its figure);
  ``radix-1`` is the exact token prefix.

Where a pair parts (``position``: the 0-based index of the first token that differs, when neither
prompt is a prefix of the other) the cause is classified from the two renderings; see ``KINDS``.

*If moved*: every request is rendered again with what varies moved after what does not, and the
ratio recomputed from those token sequences (nothing is assumed to hit). What moves is decided
per session, from its pairs: where the tool definitions' text changed between requests, they are
rendered in one canonical order (each tool's keys sorted, the tools sorted by that JSON); where a
timestamp or id parted a pair, every volatile-looking value of that part (``VOLATILE``) is cut
out and appended after the last message (a message of the same role); where JSON keys in a
message came in another order, that message's JSON objects get sorted keys; where the system
prompt changed, the part of it that varies (what lies between the prefix and the suffix all of
its versions from the change on share) is appended after the last message, the rest kept in
place. A session where nothing varied is its own if-moved rendering.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from loadgen.request_log import LoggedRequest, Message, Span, iter_request_log, tools_json
from shared import tokenizer
from shared.errors import InputError, TraceFormatError


class Mode(NamedTuple):
    name: str
    kind: str  # "blocks" | "radix"
    size: int

    def cached(self, common: int, previous: int) -> int:
        """Tokens reused of a prompt that shares ``common`` leading tokens with a cached prompt of
        ``previous`` tokens."""
        n = min(common, previous) if self.kind == "blocks" else common
        return n // self.size * self.size

    @property
    def definition(self) -> str:
        if self.kind == "blocks":
            return (f"vLLM-style blocks of {self.size} tokens: the common token prefix, at most the earlier prompt's"
                    " length, in whole blocks (a partial last block is never reused)")
        return f"SGLang-style radix tree, page size {self.size}: the longest common token prefix, in whole pages"


MODES = (Mode("blocks-16", "blocks", 16), Mode("blocks-1024", "blocks", 1024),
         Mode("radix-1", "radix", 1), Mode("radix-16", "radix", 16))
MODE_NAMES = tuple(m.name for m in MODES)
DEFAULT_MODE = "blocks-16"
ASSUMPTION = ("each request finds its session's previous prompt cached (the prompt, not its response);"
              " a session's first request finds nothing")

KINDS = {
    "timestamp_or_id": "a date, time, number or id where the previous request had another: move it after the"
                       " last message",
    "reordered_keys": "the same tool definitions or JSON keys in another order: send them in one order",
    "system_prompt_changed": "the system prompt changed: keep it fixed, put what changes after the history",
    "tools_changed": "tool definitions added, removed or edited (they open the prompt)",
    "history_edited": "an earlier message (user, assistant or tool) changed or went",
    "reply_not_carried": "the next request does not carry the previous reply where the previous prompt ended",
    "prompt_edited": "a completions prompt changed",
    "none": "nothing parts: one prompt is a prefix of the other",
}
SYSTEM_ROLES = ("system", "developer")

# Values that change from request to request: a UUID, a date or date-time, a time of day, an id
# (8+ letters, digits, '-' or '_', with a digit and a letter), a number.
VOLATILE = re.compile(r"""
    (?<![\w-])[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}(?![\w-])
  | (?<!\d)\d{4}-\d{2}-\d{2}(?:[T\ ]\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?
  | (?<!\d)\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?
  | (?<![\w-])(?=[\w-]*\d)(?=[\w-]*[A-Za-z])[A-Za-z0-9][\w-]{7,}
  | (?<![\w.])\d+(?:\.\d+)?
""", re.X | re.A)
_EXCERPT = 28  # characters each side of the departing token


def common_prefix(a, b) -> int:
    """How many leading items two sequences (token lists, strings) share; C-speed in chunks."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, step = 0, 256
    while lo + step <= n and a[lo:lo + step] == b[lo:lo + step]:
        lo += step
    while lo < n and a[lo] == b[lo]:
        lo += 1
    return lo


# ---- what a parting point looks like ----------------------------------------------------------


def volatile_at(text: str, char: int) -> tuple[int, int] | None:
    """The volatile value of ``text`` that covers character ``char``, as (start, end)."""
    start = max(0, char - 96)
    while start > 0 and (text[start - 1].isalnum() or text[start - 1] in "-_:") and char - start < 256:
        start -= 1
    for m in VOLATILE.finditer(text, start, min(len(text), char + 256)):
        if m.start() <= char < m.end():
            return m.start(), m.end()
        if m.start() > char:
            break
    return None


def cut_volatile(text: str) -> tuple[str, list[str]]:
    """``text`` without its volatile values, and the values in order."""
    values = VOLATILE.findall(text)
    return (VOLATILE.sub("", text), values) if values else (text, [])


def _core(request: LoggedRequest, position: int) -> int:
    """Where token ``position``'s first non-blank character is in the rendered text."""
    piece = request.piece(position)
    return request.offsets()[position] + len(piece) - len(piece.lstrip())


def _content_start(span: Span) -> int:
    """Where a part's content starts in the rendered text (after its "<|im_start|>role\\n")."""
    if span.part == "tools":
        return span.char + tokenizer.chat_template([], "\0").index("\0")
    if span.part == "message":
        return span.char + tokenizer.chat_template([{"role": span.role, "content": "\0"}]).index("\0")
    return span.char


def _json_at(text: str, start: int) -> tuple[object, int] | None:
    try:
        value, end = json.JSONDecoder().raw_decode(text, start)
    except (ValueError, RecursionError):
        return None
    return (value, end)


def json_reordered(a: str, b: str, char: int) -> bool:
    """Whether the innermost JSON object that both ``a`` and ``b`` hold around ``char`` (the same
    text before it) has the same keys and values in both, in another order."""
    at = char
    for _ in range(32):
        at = a.rfind("{", max(0, char - 20_000), at)
        if at < 0:
            return False
        da, db = _json_at(a, at), _json_at(b, at)
        if da and db and da[1] > char and db[1] > char and isinstance(da[0], dict) and isinstance(db[0], dict):
            return json.dumps(da[0], sort_keys=True) == json.dumps(db[0], sort_keys=True)
    return False


def canonical_json_in(text: str) -> str:
    """``text`` with each JSON object in it rewritten with sorted keys (compact)."""
    out, last, at = [], 0, text.find("{")
    while at >= 0:
        found = _json_at(text, at)
        if found and isinstance(found[0], dict):
            value, end = found
            out += [text[last:at], json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)]
            last, at = end, text.find("{", end)
        else:
            at = text.find("{", at + 1)
    return "".join(out) + text[last:] if out else text


def classify(previous: LoggedRequest, current: LoggedRequest, position: int) -> tuple[str, Span]:
    """The cause of a pair parting at token ``position``, and the part of ``current`` it is in."""
    sp, sc = previous.span_at(position), current.span_at(position)
    both_text = bool(previous.text) and bool(current.text)
    same = sp.part == sc.part and sp.message == sc.message and sp.role == sc.role
    if same and sc.part == "tools" and tools_json(previous.tools, True) == tools_json(current.tools, True):
        return "reordered_keys", sc
    if both_text and same and sc.part == "message":
        start = _content_start(sc)
        if json_reordered(previous.text[start:], current.text[start:], previous.offsets()[position] - start):
            return "reordered_keys", sc
    if both_text and volatile_at(previous.text, _core(previous, position)) and \
            volatile_at(current.text, _core(current, position)):
        return "timestamp_or_id", sc
    if "tools" in (sp.part, sc.part):
        return "tools_changed", sc
    if sp.part == "generation":
        return "reply_not_carried", sc
    if sp.role in SYSTEM_ROLES or sc.role in SYSTEM_ROLES:
        return "system_prompt_changed", sc
    if sc.part == "prompt":
        return "prompt_edited", sc
    return "history_edited", sc


def excerpt(request: LoggedRequest, position: int) -> str:
    """The rendered text around token ``position``, that token in brackets, newlines as \\n."""
    offsets = request.offsets()
    if not offsets:
        ids = request.tokens
        return " ".join(map(str, ids[max(0, position - 4):position])) + f" [{ids[position]}] " + \
            " ".join(map(str, ids[position + 1:position + 5]))
    text, start, stop = request.text, offsets[position], offsets[position + 1]
    before = ("..." if start > _EXCERPT else "") + text[max(0, start - _EXCERPT):start]
    after = text[stop:stop + _EXCERPT] + ("..." if stop + _EXCERPT < len(text) else "")

    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace("\n", "\\n")

    return f"{esc(before)}[{esc(text[start:stop])}]{esc(after)}"


# ---- the audit --------------------------------------------------------------------------------


@dataclass(slots=True)
class Pair:
    """Two consecutive requests of a session, and what the later one finds cached."""

    session: str
    previous_line: int
    line: int
    previous_tokens: int
    tokens: int
    common: int  # leading tokens the two prompts share
    cached: tuple[int, ...]  # per mode, in MODES order
    kind: str  # a KINDS key ("none": one prompt is a prefix of the other)
    position: int | None = None  # the first token that differs (None for "none")
    part: str = ""  # the part of the later prompt it is in ("message 0 (system)", "tools", ...)
    token_previous: str = ""
    token_current: str = ""
    excerpt_previous: str = ""
    excerpt_current: str = ""
    cached_if_moved: tuple[int, ...] = ()  # per mode, after the move (see the module's doc)


@dataclass(slots=True)
class Cause:
    """Pairs that part for the same reason at the same token."""

    kind: str
    position: int
    part: str
    requests: list[int] = field(default_factory=list)  # line numbers of the later request of each pair
    sessions: list[str] = field(default_factory=list)
    tokens_lost: int = 0  # in the headline mode: what the pairs would cache had they not parted, less what they do


@dataclass(slots=True)
class Audit:
    log: str
    default_mode: str
    requests: int
    chat_requests: int
    sessions_given: int
    sessions_inferred: int
    prompt_tokens: int
    prompt_tokens_if_moved: int
    cached: tuple[int, ...]  # per mode, in MODES order
    cached_if_moved: tuple[int, ...]
    pairs: list[Pair]  # by session (in order of first appearance), then by line
    causes: list[Cause]  # the most tokens lost first

    def ratio(self, mode: str, moved: bool = False) -> float:
        i = MODE_NAMES.index(mode)
        total = self.prompt_tokens_if_moved if moved else self.prompt_tokens
        return (self.cached_if_moved if moved else self.cached)[i] / total if total else 0.0


@dataclass(slots=True)
class _Stable:
    """The prefix and suffix every version of one system message shares, as written and with its
    volatile values cut out (``cut``)."""

    raw: tuple[str, str, int]  # (prefix, suffix, shortest length)
    cut: tuple[str, str, int]

    @classmethod
    def of(cls, text: str) -> _Stable:
        cut = cut_volatile(text)[0]
        return cls((text, text, len(text)), (cut, cut, len(cut)))

    def update(self, text: str) -> None:
        self.raw, self.cut = _shared(self.raw, text), _shared(self.cut, cut_volatile(text)[0])

    def split(self, text: str, cut: bool) -> tuple[str, str]:
        """(the stable text, the varying part) of one version; all stable when it does not fit."""
        prefix, suffix, shortest = self.cut if cut else self.raw
        suffix = suffix[len(suffix) - max(0, min(len(suffix), shortest - len(prefix))):]
        if len(text) < len(prefix) + len(suffix) or not (text.startswith(prefix) and text.endswith(suffix)):
            return text, ""
        return prefix + suffix, text[len(prefix):len(text) - len(suffix)]


def _shared(state: tuple[str, str, int], text: str) -> tuple[str, str, int]:
    prefix, suffix, shortest = state
    p = common_prefix(prefix, text)
    s = common_prefix(suffix[::-1], text[::-1])
    return prefix[:p], suffix[len(suffix) - s:], min(shortest, len(text))


@dataclass(slots=True)
class _Plan:
    """What moves in one session's requests (see the module's doc)."""

    volatile: set[tuple[str, int]] = field(default_factory=set)  # (part, message index)
    tools: bool = False  # the tool definitions' text changed between requests: one canonical order
    json: set[int] = field(default_factory=set)  # messages whose JSON objects get sorted keys
    system: dict[int, _Stable] = field(default_factory=dict)  # system messages whose varying part moves

    def learn(self, kind: str, span: Span, previous: LoggedRequest) -> None:
        if kind == "timestamp_or_id":
            self.volatile.add((span.part, span.message))
        elif kind == "reordered_keys" and span.part == "message":
            self.json.add(span.message)
        elif kind == "system_prompt_changed" and span.message not in self.system and span.role in SYSTEM_ROLES \
                and span.message < len(previous.messages) and previous.messages[span.message].role == span.role:
            self.system[span.message] = _Stable.of(previous.messages[span.message].content)

    def see(self, request: LoggedRequest) -> None:
        for i, stable in self.system.items():
            if i < len(request.messages) and request.messages[i].role in SYSTEM_ROLES:
                stable.update(request.messages[i].content)


def moved_tokens(request: LoggedRequest, plan: _Plan | None) -> list[int]:
    """The request's token ids with what varies moved after what does not (see the module's doc)."""
    plan = plan or _Plan()
    if request.kind != "chat":
        if request.prompt is None:  # token ids: nothing to move
            return request.tokens
        text, values = cut_volatile(request.prompt) if ("prompt", -1) in plan.volatile else (request.prompt, [])
        return tokenizer.encode(text + "\n" + " ".join(values) if values else text)
    tools, tail = tools_json(request.tools, canonical=plan.tools), []
    if ("tools", -1) in plan.volatile:
        tools, values = cut_volatile(tools)
        tail += [Message("system", " ".join(values))] if values else []
    messages = []
    for i, m in enumerate(request.messages):
        content = canonical_json_in(m.content) if i in plan.json else m.content
        cut = ("message", i) in plan.volatile
        if cut:
            content, values = cut_volatile(content)
            tail += [Message(m.role, " ".join(values))] if values else []
        if i in plan.system and m.role in SYSTEM_ROLES:
            content, varying = plan.system[i].split(content, cut)
            tail += [Message(m.role, varying)] if varying else []
        messages.append(Message(m.role, content))
    return tokenizer.encode(tokenizer.chat_template([m._asdict() for m in messages + tail], tools))


def pair_of(previous: LoggedRequest, current: LoggedRequest) -> tuple[Pair, Span | None]:
    """The pair's row, and the part of ``current`` where they part (None when they do not)."""
    a, b = previous.tokens, current.tokens
    common = common_prefix(a, b)
    cached = tuple(m.cached(common, len(a)) for m in MODES)
    pair = Pair(current.session, previous.line, current.line, len(a), len(b), common, cached, "none")
    if common >= min(len(a), len(b)):
        return pair, None
    kind, span = classify(previous, current, common)
    pair.kind, pair.position, pair.part = kind, common, span.label
    pair.token_previous, pair.token_current = previous.piece(common), current.piece(common)
    pair.excerpt_previous, pair.excerpt_current = excerpt(previous, common), excerpt(current, common)
    return pair, span


def audit_log(path: str | Path, default_mode: str = DEFAULT_MODE) -> Audit:
    """Audit a request log (see the module's doc): two passes over the file, holding one request
    per session; linear in the log's tokens. The second pass renders again only the sessions
    where something moves."""
    if default_mode not in MODE_NAMES:
        raise InputError("--mode", f"unknown mode {default_mode!r}; valid: {', '.join(MODE_NAMES)}")
    first = _FirstPass(MODE_NAMES.index(default_mode))
    for r in iter_request_log(path):
        with _nesting(path, r):
            first.add(r)
    tokens_moved = first.tokens
    if first.plans:
        tokens_moved += _moved(path, first) - sum(first.session_tokens[k] for k in first.plans)
    cached_moved = [sum(p.cached_if_moved[i] for _, _, _, p in first.pairs) for i in range(len(MODES))]
    for key, cause in first.causes.items():
        cause.sessions = list(first.cause_sessions[key])
    ranked = sorted(first.causes.values(), key=lambda c: (-c.tokens_lost, c.position, c.kind, c.requests[0]))
    given = sum(1 for g, _ in first.order if g)
    by_session = [p for _, _, _, p in sorted(first.pairs, key=lambda t: (t[1], t[2]))]
    return Audit(str(path), default_mode, first.requests, first.chat, given, len(first.order) - given,
                 first.tokens, tokens_moved, tuple(first.cached), tuple(cached_moved), by_session, ranked)


class _FirstPass:
    """The audit's first pass: each pair, its cause, and what each session's move will be."""

    def __init__(self, head: int) -> None:
        self.head = head  # the headline mode's index
        self.last: dict[tuple[bool, str], LoggedRequest] = {}
        self.order: dict[tuple[bool, str], int] = {}  # session -> its rank of first appearance
        self.session_tokens: dict[tuple[bool, str], int] = {}
        self.plans: dict[tuple[bool, str], _Plan] = {}  # the sessions where something moves
        self.causes: dict[tuple[str, int, str], Cause] = {}
        self.cause_sessions: dict[tuple[str, int, str], dict[str, None]] = {}
        self.pairs: list[tuple[tuple[bool, str], int, int, Pair]] = []  # (session, its rank, line, pair), in log order
        self.cached = [0] * len(MODES)
        self.requests = self.chat = self.tokens = 0

    def add(self, r: LoggedRequest) -> None:
        key = (r.session_given, r.session)
        self.requests += 1
        self.chat += r.kind == "chat"
        self.tokens += len(r.tokens)
        self.session_tokens[key] = self.session_tokens.get(key, 0) + len(r.tokens)
        self.order.setdefault(key, len(self.order))
        previous = self.last.get(key)
        if previous is not None:
            pair, span = pair_of(previous, r)
            pair.cached_if_moved = pair.cached  # unless the second pass moves this session
            self.pairs.append((key, self.order[key], r.line, pair))
            self.cached = [c + n for c, n in zip(self.cached, pair.cached)]
            if previous.tools_text() != r.tools_text():
                self.plans.setdefault(key, _Plan()).tools = True
            if span is not None and pair.position is not None:
                self.plans.setdefault(key, _Plan()).learn(pair.kind, span, previous)
                self._count(pair, previous, r)
        if key in self.plans:
            self.plans[key].see(r)
        self.last[key] = r

    def _count(self, pair: Pair, previous: LoggedRequest, r: LoggedRequest) -> None:
        assert pair.position is not None
        key = (pair.kind, pair.position, pair.part)
        cause = self.causes.setdefault(key, Cause(pair.kind, pair.position, pair.part))
        cause.requests.append(r.line)
        self.cause_sessions.setdefault(key, {})[r.session] = None
        mode = MODES[self.head]
        unparted = mode.cached(min(len(previous.tokens), len(r.tokens)), len(previous.tokens))
        cause.tokens_lost += unparted - pair.cached[self.head]


@contextmanager
def _nesting(path: str | Path, r: LoggedRequest) -> Iterator[None]:
    """JSON the reader rendered but a deeper call cannot (tools nested ~1,000 deep): the line's error."""
    try:
        yield
    except RecursionError:
        raise TraceFormatError(str(path), r.line, "line", "nested too deeply") from None


def _moved(path: str | Path, first: _FirstPass) -> int:
    """The second pass, over the sessions where something moves: each request rendered moved, and
    each of their pairs' cached tokens after the move set on the pair. The moved requests' tokens."""
    pairs = {line: p for key, _, line, p in first.pairs if key in first.plans}
    last: dict[tuple[bool, str], list[int]] = {}
    tokens = 0
    for r in iter_request_log(path, render=False):
        key = (r.session_given, r.session)
        plan = first.plans.get(key)
        if plan is None:
            continue
        with _nesting(path, r):
            moved = moved_tokens(r, plan)
        tokens += len(moved)
        previous = last.get(key)
        if previous is not None:
            common = common_prefix(previous, moved)
            pairs[r.line].cached_if_moved = tuple(m.cached(common, len(previous)) for m in MODES)
        last[key] = moved
    return tokens
