"""loadgen.request_log: request logs of OpenAI bodies read as the emulated server renders them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from loadgen.request_log import (
    SAMPLE_LOG,
    LoggedRequest,
    Span,
    iter_request_log,
    parse_body,
    parse_record,
    read_request_log,
    resolve_log,
)
from shared import protocol, tokenizer
from shared.errors import InputError, KvemuError, TraceFormatError

REPO = Path(__file__).resolve().parents[2]
SERVER_LIMITS = (1 << 20, 1 << 20)


def write_log(path: Path, lines: list) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def chat(*contents: str, **extra) -> dict:
    """A chat body: the first content is the user's, then assistant and user alternate."""
    roles = ["user", "assistant"]
    return {"messages": [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)], **extra}


# ---- rendering: the server's tokens --------------------------------------------------------


TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
BODIES = [
    (True, chat("Name three primes.", max_tokens=7)),
    (True, {"messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}],
            "tools": TOOLS, "max_completion_tokens": 9}),
    (True, {"messages": [{"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]},
                         {"role": "assistant", "content": None,
                          "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": "42"}]}),
    (False, {"prompt": "Once upon a time", "max_tokens": 3}),
    (False, {"prompt": ["Once upon a time"]}),
    (False, {"prompt": [1, 2, 3, 99]}),
    (False, {"prompt": [[5, 6, 7]]}),
]


@pytest.mark.parametrize("is_chat, body", BODIES)
def test_tokens_and_max_tokens_are_the_servers(is_chat, body):
    spec = protocol.parse_openai(body, is_chat, 16, SERVER_LIMITS, None)
    request = parse_body(body)
    assert request.kind == ("chat" if is_chat else "completion")
    assert request.tokens == spec.block_tokens[:spec.prompt_tokens]
    assert request.max_tokens == spec.max_tokens


def test_a_tiny_chat_rendered_token_by_token():
    r = parse_body({"messages": [{"role": "user", "content": "a b c"}]})
    # "<|im_start|>user\na b c<|im_end|>\n<|im_start|>assistant\n": whitespace glues to the next token,
    # words of up to 8 characters are one token ("assistant" is two), each punctuation mark one
    pieces = ["<", "|", "im_start", "|", ">", "user", "\na", " b", " c", "<", "|", "im_end", "|", ">",
              "\n<", "|", "im_start", "|", ">", "assistan", "t"]
    assert [r.piece(i) for i in range(len(r.tokens))] == pieces
    assert r.tokens == tokenizer.encode(r.text)
    assert list(r.offsets()) == [sum(map(len, pieces[:i])) for i in range(len(pieces) + 1)]
    # a token belongs to the part its first non-blank character is in: "\n<" opens the generation prompt
    assert r.spans() == [Span("message", 0, "user", 0, 0), Span("generation", -1, "", 14, 33)]  # 17 + 5 + 11 characters
    assert [r.span_at(i).label for i in (0, 13, 14, 20)] == ["message 0 (user)"] * 2 + ["generation prompt"] * 2
    assert r.tools_text() == ""


def test_tools_open_the_prompt_in_the_clients_key_order():
    tools = [{"function": {"parameters": {}, "name": "f"}, "type": "function"}]
    r = parse_body({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], "tools": tools})
    assert r.text.startswith('<|im_start|>tools\n[{"function":{"parameters":{},"name":"f"},"type":"function"}]<|im_end|>\n')
    assert [s.label for s in r.spans()] == ["tools", "message 0 (system)", "message 1 (user)", "generation prompt"]
    # the tools part: "<|im_start|>tools" (6 tokens), the JSON (33: "\n[", "{", '"', "function", '"', ":", "{", '"',
    # "paramete", "rs", ...), "<|im_end|>" (5); each message part "<|im_start|>role" (6), its text (1), "<|im_end|>" (5)
    assert [s.token for s in r.spans()] == [0, 44, 56, 68]
    assert r.tools_text() == r.text[:r.spans()[1].char] and r.tools == tools
    assert r.messages[0].role == "system" and r.messages[1].content == "u"


def test_a_prompt_of_token_ids_has_no_text():
    r = parse_body({"prompt": [7, 8, 9]})
    assert r.text == "" and r.tokens == [7, 8, 9] and r.prompt is None
    assert list(r.offsets()) == [] and r.piece(1) == "8" and r.span_at(2).part == "prompt"


# ---- lines, sessions, timestamps ---------------------------------------------------------


def test_record_forms_and_which_session_wins():
    body = chat("hi", user="u-1", metadata={"session_id": "m-1"})
    assert parse_record(body, 1).session == "m-1"  # metadata.session_id before user
    assert parse_record({**body, "X-Session-Id": "h-1"}, 1).session == "h-1"  # a header before both
    wrapped = {"timestamp": 12.5, "headers": {"x-session-id": "h-2"}, "body": body}
    r = parse_record(wrapped, 3)
    assert (r.line, r.timestamp, r.session, r.session_given) == (3, 12.5, "h-2", True)
    assert parse_record({**wrapped, "session": "s-1"}, 1).session == "s-1"  # the record's own session first
    assert parse_record({"session_id": 17, "body": chat("hi")}, 1).session == "17"
    assert parse_record(chat("hi", user="u-2"), 1).session == "u-2"
    r = parse_record(chat("hi"), 1)
    assert (r.session, r.session_given, r.timestamp) == ("", False, None)


@pytest.mark.parametrize("value, seconds", [("2026-12-01T10:31:07Z", 1796121067.0), ("2026-12-01T10:31:07", 1796121067.0),
                                            ("2026-12-01T11:31:07+01:00", 1796121067.0), (5, 5.0)])
def test_timestamps_are_seconds_or_iso_8601(value, seconds):
    assert parse_record({"timestamp": value, "body": chat("x")}, 1).timestamp == seconds


def test_sessions_are_inferred_from_the_first_user_message(tmp_path):
    sys1 = {"role": "system", "content": "v1"}
    sys2 = {"role": "system", "content": "v2"}
    lines = [
        {"messages": [sys1, {"role": "user", "content": "plan a trip"}]},
        {"messages": [sys1, {"role": "user", "content": "fix my code"}]},
        {"messages": [sys2, {"role": "user", "content": "plan a trip"}, {"role": "assistant", "content": "ok"},
                      {"role": "user", "content": "to Oslo"}]},  # another system prompt: the same conversation
        {"session": "given", "body": chat("plan a trip")},  # a given session is never merged
        {"prompt": "one"},
        {"prompt": "two"},  # session-less completions: one session
        {"messages": [{"role": "system", "content": "only a system message"}]},  # keyed on its first message
    ]
    log = read_request_log(write_log(tmp_path / "log.jsonl", lines))
    assert [r.session for r in log.requests] == ["inferred-1", "inferred-2", "inferred-1", "given", "inferred-3",
                                                 "inferred-3", "inferred-4"]
    assert [r.session_given for r in log.requests] == [False, False, False, True, False, False, False]
    assert (log.sessions_given, log.sessions_inferred) == (1, 4)
    assert [r.line for r in log.requests] == list(range(1, 8))
    assert all(isinstance(r, LoggedRequest) for r in log.requests)


def test_blank_lines_are_skipped_and_gzip_is_read(tmp_path):
    path = tmp_path / "log.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write("\n" + json.dumps(chat("a")) + "\n\n" + json.dumps(chat("b")) + "\n")
    assert [r.line for r in iter_request_log(path)] == [2, 4]


def test_the_sample_is_shipped_and_found_by_name():
    path = Path(resolve_log(SAMPLE_LOG))
    assert path.is_file() and path.name == "prompt_log_sample.jsonl" and path.parent == REPO / "loadgen" / "data"
    assert '"*.jsonl"' in (REPO / "pyproject.toml").read_text()  # package data: installed with the package
    log = read_request_log(SAMPLE_LOG)
    assert len(log.requests) == 13 and (log.sessions_given, log.sessions_inferred) == (3, 1)


def test_render_false_skips_the_encoding():
    r = parse_record({"session": "s", "body": chat("a b c")}, 1, render=False)
    assert r.tokens == [] and r.text == "" and r.messages[0].content == "a b c" and r.session == "s"


# ---- bad input: one error naming the line and the field ----------------------------------------


BAD = [
    ('{"messages": [', "bad.jsonl:2: field 'line': malformed JSON (Expecting value)"),
    ("[1, 2]", "bad.jsonl:2: field 'line': expected an object, got list"),
    ({"messages": [{"role": "bot", "content": "x"}]}, "bad.jsonl:2: field 'messages[0].role': unknown role 'bot'"),
    ("[" * 1100 + "]" * 1100, "bad.jsonl:2: field 'line': nested too deeply"),
    ({"body": 3}, "bad.jsonl:2: field 'body': expected an object, got int"),
    ({"foo": 1}, "bad.jsonl:2: field 'body': expected an OpenAI chat body (messages) or completions body (prompt)"),
    ({"messages": [{"role": "user", "content": "x"}], "prompt": "y"}, "bad.jsonl:2: field 'body': has both messages and"
                                                                      " prompt; send one"),
    ({"body": chat("x", n=2)}, "bad.jsonl:2: field 'body.n': only n=1 is emulated, got 2"),
    ({"body": chat("x", metadata={"session_id": 5})}, "bad.jsonl:2: field 'body.metadata.session_id': expected a string,"
                                                      " got int"),
    ({"timestamp": "yesterday", "body": chat("x")}, "bad.jsonl:2: field 'timestamp': not an ISO 8601 time: 'yesterday'"),
    ({"headers": [], "body": chat("x")}, "bad.jsonl:2: field 'headers': expected an object, got list"),
    ({"prompt": "a \ud800"}, "bad.jsonl:2: field 'prompt': holds a lone surrogate (\\ud800-\\udfff), which is not text"),
    (chat("x", stop=["\n"]), "bad.jsonl:2: field 'stop': stop sequences are not emulated (outputs always run to max_tokens)"),
]


@pytest.mark.parametrize("line, message", BAD)
def test_a_bad_line_names_its_line_and_field(tmp_path, line, message):
    path = write_log(tmp_path / "bad.jsonl", [chat("fine"), line])
    with pytest.raises(TraceFormatError) as err:
        list(iter_request_log(path))
    assert str(err.value) == str(tmp_path / message)


def test_tools_nested_deeper_than_the_renderer_goes_are_a_line_error(tmp_path):
    # orjson takes 1,022 levels (its limit is 1,024); rendering them recurses past Python's limit (1,000)
    line = '{"messages": [{"role": "user", "content": "x"}], "tools": [' + "[" * 1020 + "]" * 1020 + "]}"
    path = write_log(tmp_path / "deep.jsonl", [line])
    with pytest.raises(TraceFormatError, match=r"deep.jsonl:1: field 'tools': is nested too deeply"):
        list(iter_request_log(path))


def test_an_empty_or_missing_file(tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    for name in ("empty.jsonl", "blank.jsonl"):
        with pytest.raises(InputError, match="holds no requests"):
            list(iter_request_log(tmp_path / name))
    with pytest.raises(KvemuError, match="no file .*missing.jsonl; give a request log's path, or prompt-log-sample"):
        read_request_log(tmp_path / "missing.jsonl")
