"""A request log as a trace (``--format openai``): rendered as the server renders it, cut at any block size."""

import json

from loadgen.formats import detect_format, read_trace
from loadgen.source import load_source
from shared import tokenizer
from shared.hashing import block_hashes

SYSTEM = "You are the release assistant. Keep answers short. " * 3


def write_log(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def chat(question: str, answer: str | None = None, max_tokens: int = 7) -> dict:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What changed in 2.1?"}]
    if answer is not None:
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": question}]
    return {"model": "m", "max_tokens": max_tokens, "messages": messages}


def tokens_of(body: dict) -> list[int]:
    return tokenizer.encode(tokenizer.chat_template(body["messages"]))


def test_a_log_is_rendered_cut_into_blocks_of_the_size_asked_and_timed_from_its_first_line(tmp_path):
    first, second = chat("unused"), chat("And in 2.2?", "The cache got faster.", max_tokens=9)
    log = write_log(tmp_path / "log.jsonl", [
        {"timestamp": 100.0, "session": "s", "body": first},  # a wrapped record with a session key
        {"timestamp": 112.5, "session": "s", "body": second},
        {"timestamp": 101.0, "body": chat("unused")},  # no session: inferred
    ])
    assert detect_format(log) == "openai"
    for bs in (1, 16, 1024):
        trace = read_trace(log, "auto", bs)
        assert trace.block_size == bs and trace.meta["tokens"] is True
        a, c, b = trace.requests  # sorted by time
        assert [r.t for r in trace.requests] == [0.0, 1.0, 12.5]
        assert (a.session, a.turn, b.session, b.turn) == ("s", 0, "s", 1)
        assert c.session != "s" and c.turn == 0
        assert a.hash_ids == block_hashes(tokens_of(first), bs)
        assert b.hash_ids == block_hashes(tokens_of(second), bs)
        assert (b.input_tokens, b.output_tokens) == (len(tokens_of(second)), 9)


def test_radix_takes_a_log_and_reuses_to_the_token_where_turns_part(tmp_path):
    log = write_log(tmp_path / "log.jsonl", [chat("unused"), chat("And in 2.2?", "The cache got faster.")])

    class Args:
        trace, format, workload = log, "auto", None

    pages = load_source(Args, 1, tokens=True)
    blocks = load_source(Args, 16)
    a, b = (tokens_of(body) for body in (chat("unused"), chat("And in 2.2?", "The cache got faster.")))
    assert b[:len(a)] == a  # the next turn extends the prompt: the whole first prompt is shared
    shared = len(a)
    lead = sum(1 for x, y in zip(*(r.hash_ids for r in pages.requests)) if x == y)
    assert lead == shared and shared % 16  # pages of 1: the common prefix to the token
    lead16 = sum(1 for x, y in zip(*(r.hash_ids for r in blocks.requests)) if x == y)
    assert lead16 == shared // 16  # blocks of 16: whole blocks of it
