"""`kvemu audit`: cached prefixes per matching mode, where pairs part and why, and the if-moved ratio,
worked by hand on tiny logs and exactly on the shipped sample (loadgen/data/prompt_log_sample.jsonl)."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from kvemu.audit_cmd import audit_json, format_table
from loadgen.audit import MODE_NAMES, MODES, Mode, audit_log, common_prefix, cut_volatile
from loadgen.request_log import SAMPLE_LOG, resolve_log
from shared import tokenizer
from tests.support.kvemu_cli import run_kvemu

GEN = "<|im_start|>assistant\n"  # the template's generation prompt: 7 tokens ("\n<", "|", "im_start", "|", ">", "assistan", "t")


def write_log(path: Path, lines: list) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def cached(pair) -> dict:
    return dict(zip(MODE_NAMES, pair.cached))


# ---- the modes -------------------------------------------------------------------------------


@pytest.mark.parametrize("common, previous, want", [
    # blocks-16, blocks-1024, radix-1, radix-16
    (1030, 2000, (1024, 1024, 1030, 1024)),
    (1000, 2000, (992, 0, 1000, 992)),
    (15, 15, (0, 0, 15, 0)),
    (16, 40, (16, 0, 16, 16)),
    (0, 10, (0, 0, 0, 0)),
])
def test_each_mode_caches_whole_blocks_or_pages_of_the_common_prefix(common, previous, want):
    assert tuple(m.cached(common, previous) for m in MODES) == want
    assert MODE_NAMES == ("blocks-16", "blocks-1024", "radix-1", "radix-16")


def test_blocks_never_exceed_the_earlier_prompt():
    # common <= len(previous) for real pairs, so blocks-B and radix-B agree there; the rule itself differs
    assert Mode("blocks-16", "blocks", 16).cached(40, 20) == 16
    assert Mode("radix-16", "radix", 16).cached(40, 20) == 32


@pytest.mark.parametrize("at", [0, 1, 255, 256, 257, 511, 600, 999])
def test_common_prefix_finds_the_first_difference(at):
    a = list(range(1000))
    b = a[:at] + [-1] + a[at + 1:]
    assert common_prefix(a, b) == at
    assert common_prefix(a, a[:700]) == 700 and common_prefix("abcd", "abXd") == 2


# ---- tiny logs, worked by hand -----------------------------------------------------------------


def test_token_id_prompts_by_hand(tmp_path):
    log = write_log(tmp_path / "ids.jsonl", [
        {"prompt": list(range(1, 41)), "user": "a"},                           # 40 tokens, first: caches 0
        {"prompt": list(range(1, 38)) + [999, 998, 997], "user": "a"},         # shares 37
        {"prompt": list(range(1, 38)) + [999, 998, 997, 5, 6], "user": "a"},   # extends the previous 40
        {"prompt": list(range(2000)), "user": "b"},
        {"prompt": list(range(1030)) + [7] * 970, "user": "b"},                # shares 1,030 of 2,000
    ])
    a = audit_log(log)
    rows = [(p.previous_line, p.line, p.common, cached(p), p.kind, p.position, p.part) for p in a.pairs]
    assert rows == [
        (1, 2, 37, {"blocks-16": 32, "blocks-1024": 0, "radix-1": 37, "radix-16": 32}, "prompt_edited", 37, "prompt"),
        (2, 3, 40, {"blocks-16": 32, "blocks-1024": 0, "radix-1": 40, "radix-16": 32}, "none", None, ""),
        (4, 5, 1030, {"blocks-16": 1024, "blocks-1024": 1024, "radix-1": 1030, "radix-16": 1024}, "prompt_edited", 1030,
         "prompt"),
    ]
    assert a.prompt_tokens == 40 + 40 + 42 + 2000 + 2000
    assert a.ratio("blocks-16") == (32 + 32 + 1024) / 4122 and a.ratio("radix-1") == (37 + 40 + 1030) / 4122
    assert a.ratio("blocks-1024") == 1024 / 4122
    assert a.pairs[0].excerpt_previous == "34 35 36 37 [38] 39 40" and a.pairs[0].excerpt_current == "34 35 36 37 [999] 998 997"
    # token ids carry nothing to move: the if-moved log is the log
    assert a.prompt_tokens_if_moved == a.prompt_tokens and a.cached_if_moved == a.cached
    assert [(c.kind, c.position, c.requests, c.tokens_lost) for c in a.causes] == [
        ("prompt_edited", 1030, [5], 2000 - 1024),  # blocks-16 of min(2000, 2000) (125 blocks) less what it caches
        ("prompt_edited", 37, [2], 32 - 32),
    ]


def test_a_next_turn_that_extends_the_previous_prompt(tmp_path):
    one = [{"role": "user", "content": "a b c"}]
    two = one + [{"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}]
    a = audit_log(write_log(tmp_path / "t.jsonl", [{"messages": one}, {"messages": two}]))
    (p,) = a.pairs
    # 14 tokens for the user part, 7 for the generation prompt (21); the next turn adds "\nd<|im_end|>" (6) and a
    # user part (12) after them, its assistant part reusing the previous generation prompt's tokens: 46
    assert (p.previous_tokens, p.tokens, p.common, p.kind, p.position) == (21, 46, 21, "none", None)
    assert cached(p) == {"blocks-16": 16, "blocks-1024": 0, "radix-1": 21, "radix-16": 16}
    assert a.sessions_inferred == 1 and a.causes == [] and a.ratio("radix-1") == 21 / 67


def test_a_time_in_the_system_prompt_by_hand(tmp_path):
    def body(clock):
        return {"messages": [{"role": "system", "content": f"t={clock}"}, {"role": "user", "content": "q"}]}

    a = audit_log(write_log(tmp_path / "t.jsonl", [body("12:00"), body("12:05")]))
    (p,) = a.pairs
    # "<", "|", "im_start", "|", ">", "system", "\nt", "=", "12", ":", then "00" / "05": they part at token 10
    assert (p.kind, p.position, p.part, p.token_previous, p.token_current) == (
        "timestamp_or_id", 10, "message 0 (system)", "00", "05")
    assert p.excerpt_current == "<|im_start|>system\\nt=12:[05]<|im_end|>\\n<|im_start|>user\\n..."
    assert (p.previous_tokens, p.tokens) == (35, 35)  # system part 16, user part 12, generation prompt 7
    assert cached(p) == {"blocks-16": 0, "blocks-1024": 0, "radix-1": 10, "radix-16": 0}
    # Moved: "t=" + the user part + a closing system message holding the time. The system part is then 13
    # tokens, the user part 12, the time's message 14 ("<|im_start|>system" 6, "\n12", ":", "00", "<|im_end|>" 5),
    # the generation prompt 7: 46. The pair shares 13 + 12 + 6 + 2 = 33 tokens (up to "00" / "05").
    assert a.prompt_tokens_if_moved == 92
    assert dict(zip(MODE_NAMES, p.cached_if_moved)) == {"blocks-16": 32, "blocks-1024": 0, "radix-1": 33, "radix-16": 32}
    assert (a.ratio("blocks-16"), a.ratio("blocks-16", moved=True)) == (0.0, 32 / 92)


S = {"role": "system", "content": "Be brief."}
TOOL_F = {"type": "function", "function": {"name": "f", "parameters": {}}}
TOOL_G = {"type": "function", "function": {"name": "g", "parameters": {}}}


def _msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


@pytest.mark.parametrize("previous, current, kind, part", [
    ({"messages": _msgs(("user", "a"), ("assistant", "b"), ("user", "c"))},
     {"messages": _msgs(("user", "a"), ("assistant", "x"), ("user", "c"), ("assistant", "d"), ("user", "e"))},
     "history_edited", "message 1 (assistant)"),
    ({"messages": _msgs(("user", "a"))}, {"messages": _msgs(("user", "a"), ("user", "b"))},
     "reply_not_carried", "message 1 (user)"),
    ({"messages": [S, *_msgs(("user", "a"))]}, {"messages": [S, *_msgs(("user", "a"), ("system", "Now longer."))]},
     "reply_not_carried", "message 2 (system)"),
    ({"messages": [S], "tools": [TOOL_F]}, {"messages": [S], "tools": [TOOL_F, TOOL_G]}, "tools_changed", "tools"),
    ({"messages": [S], "tools": [TOOL_F, TOOL_G]}, {"messages": [S], "tools": [TOOL_G, TOOL_F]}, "reordered_keys", "tools"),
    ({"messages": [S]}, {"messages": [S], "tools": [TOOL_F]}, "tools_changed", "tools"),
    ({"messages": _msgs(("user", 'run {"a": 1, "b": {"c": 2, "d": 3}}'))},
     {"messages": _msgs(("user", 'run {"a": 1, "b": {"d": 3, "c": 2}}'))}, "reordered_keys", "message 0 (user)"),
    ({"messages": _msgs(("user", 'run {"a": 1, "b": 2}'))},
     {"messages": _msgs(("user", 'run {"a": 1, "b": 3}'))}, "timestamp_or_id", "message 0 (user)"),
    ({"messages": _msgs(("user", 'run {"a": 1, "b": "x"}'))},
     {"messages": _msgs(("user", 'run {"a": 1, "b": "y"}'))}, "history_edited", "message 0 (user)"),
    ({"messages": _msgs(("user", "request 6f1c2a3b-0d4e-4f5a-8b9c-0a1b2c3d4e5f: go"))},
     {"messages": _msgs(("user", "request 0a1b2c3d-4e5f-4a6b-8c7d-6f1c2a3b0d4e: go"))}, "timestamp_or_id", "message 0 (user)"),
    ({"messages": _msgs(("user", "trace req_8f3a9c2e7b go"))},
     {"messages": _msgs(("user", "trace req_9a1b7c2d3e go"))}, "timestamp_or_id", "message 0 (user)"),
    ({"messages": _msgs(("system", "Be brief."), ("user", "a"))},
     {"messages": _msgs(("system", "Be kind."), ("user", "a"))}, "system_prompt_changed", "message 0 (system)"),
    ({"messages": _msgs(("system", "Be brief."), ("user", "a"))}, {"messages": _msgs(("user", "a"))},
     "system_prompt_changed", "message 0 (user)"),
    ({"prompt": "Q: one. A:"}, {"prompt": "Q: two. A:"}, "prompt_edited", "prompt"),
    ({"prompt": "At 10:31 say"}, {"prompt": "At 10:45 say"}, "timestamp_or_id", "prompt"),
])
def test_what_a_parting_point_looks_like(tmp_path, previous, current, kind, part):
    a = audit_log(write_log(tmp_path / "t.jsonl", [{**previous, "user": "s"}, {**current, "user": "s"}]))
    (p,) = a.pairs
    assert (p.kind, p.part) == (kind, part)
    assert [(c.kind, c.position, c.part, c.requests) for c in a.causes] == [(kind, p.position, part, [2])]


def test_reordered_json_in_a_message_moved_to_sorted_keys(tmp_path):
    first = {"user": "s", "messages": _msgs(("user", 'run {"a": 1, "b": 2} now'))}
    second = {"user": "s", "messages": _msgs(("user", 'run {"b": 2, "a": 1} now'), ("assistant", "ok"), ("user", "more"))}
    a = audit_log(write_log(tmp_path / "t.jsonl", [first, second]))
    (p,) = a.pairs
    # "<|im_start|>user" (6), "\nrun", " {", '"', then "a" / "b": token 9
    assert (p.kind, p.position, p.part, p.common) == ("reordered_keys", 9, "message 0 (user)", 9)
    # moved, both send {"a":1,"b":2} (as many tokens: blanks glue to the next token), so the second extends the first
    # the first prompt: "<|im_start|>user" 6, the 15 tokens of its text, "<|im_end|>" 5, the generation prompt 7
    assert p.cached_if_moved[2] == p.previous_tokens == 33 and a.prompt_tokens_if_moved == a.prompt_tokens


def test_a_completions_prompt_moves_its_time_to_the_end(tmp_path):
    a = audit_log(write_log(tmp_path / "t.jsonl", [{"prompt": "At 10:31 say", "user": "s"},
                                                   {"prompt": "At 10:45 say", "user": "s"}]))
    (p,) = a.pairs
    # "At", " 10", ":", then "31" / "45"; moved: "At", "  say", "\n10", ":", then "31" / "45"
    assert (p.kind, p.position, p.common, p.cached[2], p.cached_if_moved[2]) == ("timestamp_or_id", 3, 3, 3, 4)


def test_the_same_cause_at_the_same_token_is_one_entry(tmp_path):
    lines = []
    for minute in range(10, 14):  # two sessions, two pairs each, all parting at the minutes
        for s in ("x", "y"):
            lines.append({"user": s, "messages": _msgs(("system", f"Now: 09:{minute}"), ("user", s))})
    a = audit_log(write_log(tmp_path / "t.jsonl", lines))
    (cause,) = a.causes
    assert (cause.kind, cause.position, cause.requests, cause.sessions) == ("timestamp_or_id", 10, [3, 4, 5, 6, 7, 8],
                                                                              ["x", "y"])
    assert [(p.session, p.line) for p in a.pairs] == [("x", 3), ("x", 5), ("x", 7), ("y", 4), ("y", 6), ("y", 8)]


def test_cut_volatile():
    assert cut_volatile("At 2026-12-01 10:31:07 (id 6f1c2a3b-0d4e-4f5a-8b9c-0a1b2c3d4e5f), 3 left") == (
        "At  (id ),  left", ["2026-12-01 10:31:07", "6f1c2a3b-0d4e-4f5a-8b9c-0a1b2c3d4e5f", "3"])
    assert cut_volatile("plain words, state-of-the-art") == ("plain words, state-of-the-art", [])


# ---- the sample ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample():
    return audit_log(SAMPLE_LOG)


def test_the_sample_finds_the_three_causes(sample):
    # Line 1, 5, 9: session clock-1, "Current time: 2026-12-01 10:31:07. ..." opening the system prompt, a new
    # time each turn: "<|im_start|>system" (6 tokens), "\nCurrent", " time", ":", " 2026", "-", "12", "-", "01",
    # " 10", ":" (10), then the minutes "31" / "32" / "34": token 16.
    # Lines 2, 6, 10: trip-42, two tools sent in another order from line 6 on: "<|im_start|>tools" (6), then
    # '\n[{"type":"function","function":{"name":"' (20 tokens), then "get_weat" / "search_f": token 26.
    # Lines 3, 7, 11, 13: doc-7, the system prompt edited at line 11: "<|im_start|>system" (6), "\nYou are a writing
    # assistant for the Acme blog. Keep the author's voice, fix grammar and spelling, and answer" (25), then
    # " in" / " with": token 31. Lines 4, 8, 12: a clean session, given none (inferred from its first user message).
    got = [(c.kind, c.position, c.part, c.requests, c.sessions) for c in sample.causes]
    assert got == [
        ("reordered_keys", 26, "tools", [6], ["trip-42"]),
        ("timestamp_or_id", 16, "message 0 (system)", [5, 9], ["clock-1"]),
        ("system_prompt_changed", 31, "message 0 (system)", [11], ["doc-7"]),
    ]
    assert [c.tokens_lost for c in sample.causes] == [288 - 16, (128 - 16) + (80 - 16), 128 - 16]


def test_the_positions_are_the_tokens_before_the_parting_text(sample):
    lines = [json.loads(x) for x in Path(resolve_log(SAMPLE_LOG)).read_text().splitlines()]
    clock = lines[0]["body"]["messages"][0]["content"]
    before = "<|im_start|>system\n" + clock[:clock.index("31:07")]
    assert len(tokenizer.encode(before)) == 16
    tools = json.dumps(lines[1]["tools"], separators=(",", ":"))
    assert len(tokenizer.encode("<|im_start|>tools\n" + tools[:tools.index("get_weather")])) == 26
    doc = lines[2]["body"]["messages"][0]["content"]
    assert len(tokenizer.encode("<|im_start|>system\n" + doc[:doc.index(" in one short")])) == 31


def test_the_sample_pairs_and_ratios(sample):
    rows = [(p.session, p.previous_line, p.line, p.previous_tokens, p.tokens, p.cached, p.kind, p.position)
            for p in sample.pairs]
    assert rows == [
        ("clock-1", 1, 5, 89, 143, (16, 0, 16, 16), "timestamp_or_id", 16),
        ("clock-1", 5, 9, 143, 194, (16, 0, 16, 16), "timestamp_or_id", 16),
        ("trip-42", 2, 6, 290, 337, (16, 0, 26, 16), "reordered_keys", 26),
        ("trip-42", 6, 10, 337, 375, (336, 0, 337, 336), "none", None),
        ("doc-7", 3, 7, 75, 131, (64, 0, 75, 64), "none", None),
        ("doc-7", 7, 11, 131, 190, (16, 0, 31, 16), "system_prompt_changed", 31),
        ("doc-7", 11, 13, 190, 240, (176, 0, 190, 176), "none", None),
        ("inferred-1", 4, 8, 55, 111, (48, 0, 55, 48), "none", None),
        ("inferred-1", 8, 12, 111, 160, (96, 0, 111, 96), "none", None),
    ]
    assert (sample.requests, sample.sessions_given, sample.sessions_inferred, sample.prompt_tokens) == (13, 3, 1, 2390)
    # blocks-16: the pairs' cached tokens add up to 784 of the 2,390 prompt tokens (the sessions' first requests,
    # lines 1-4, cache nothing); radix-1: 857
    assert sample.cached == (784, 0, 857, 784)
    assert sample.ratio("blocks-16") == 784 / 2390 and sample.ratio("radix-1") == 857 / 2390


def test_the_sample_if_moved(sample):
    # Moved, blocks-16 per pair: clock-1 64 and 128 (the time goes to a closing system message: each pair shares
    # all but the closing messages), trip-42 288 and 336 (the tools in one order: line 6 extends line 2), doc-7 64,
    # 112 and 176 (the system prompt's changing words, "in one short paragraph" / "with a bulleted list of changes",
    # go to a closing system message), inferred-1 48 and 96 (nothing moves): 1,312.
    moved = [p.cached_if_moved for p in sample.pairs]
    assert [m[0] for m in moved] == [64, 128, 288, 336, 64, 112, 176, 48, 96]
    assert [m[2] for m in moved] == [77, 131, 290, 337, 68, 124, 182, 55, 111]
    # Prompt tokens: clock-1's 3 requests each lose the 10 tokens of the time and gain a closing message of 21
    # ("<|im_start|>system" 6, the time 10, "<|im_end|>" 5); doc-7's 4 each lose 4 words and gain a message of
    # 6 + 4 + 5: 2,390 + 3 x 11 + 4 x 11 = 2,467.
    assert sample.prompt_tokens_if_moved == 2467
    assert sample.cached_if_moved == (1312, 0, 1375, 1312)
    assert sample.ratio("blocks-16", moved=True) == 1312 / 2467


def test_the_moved_clock_pair_derived_from_the_tokenizer(sample):
    """Line 1 moved, then line 5 moved, share their system prompt less the time, the first user message, and
    the "<|im_start|>" of the next part (the moved time's message in one, the assistant's reply in the other)."""
    first = json.loads(Path(resolve_log(SAMPLE_LOG)).read_text().splitlines()[0])["body"]["messages"]
    system = first[0]["content"].replace("2026-12-01 10:31:07", "")
    shared = tokenizer.chat_template([{"role": "system", "content": system}, first[1]])[:-len(GEN)] + "<|im_start|>"
    assert sample.pairs[0].cached_if_moved[2] == len(tokenizer.encode(shared)) == 77


def test_json_and_table(sample):
    out = audit_json(sample)
    assert {"token_hit_ratio", "token_hit_ratio_if_moved", "causes", "modes", "pairs", "default_mode"} <= set(out)
    assert out["default_mode"] == "blocks-16" and out["token_hit_ratio"] == 784 / 2390
    assert out["token_hit_ratio_by_mode"]["radix-1"] == 857 / 2390
    assert out["modes"]["blocks-1024"]["size"] == 1024 and "vLLM" in out["modes"]["blocks-16"]["definition"]
    assert out["sessions"] == {"total": 4, "given": 3, "inferred": 1}
    assert [(c["kind"], c["position"], c["requests"]) for c in out["causes"]] == [
        ("reordered_keys", 26, [6]), ("timestamp_or_id", 16, [5, 9]), ("system_prompt_changed", 31, [11])]
    assert out["pairs"][0]["cached"] == {"blocks-16": 16, "blocks-1024": 0, "radix-1": 16, "radix-16": 16}
    assert len(audit_json(sample, 2)["pairs"]) == 2 and audit_json(sample, 2)["pair_count"] == 9
    table = format_table(sample)
    assert "  blocks-16 *            784       0.328       0.532" in table
    assert "...Current time: 2026-12-01 10:[31]:07. You are the support ass..." in table


# ---- the command ----------------------------------------------------------------------------------


def test_the_command_prints_json_and_a_table():
    out = run_kvemu("audit", SAMPLE_LOG, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert Fraction(data["token_hit_ratio"]).limit_denominator(10_000) == Fraction(784, 2390)
    assert Fraction(data["token_hit_ratio_if_moved"]).limit_denominator(10_000) == Fraction(1312, 2467)
    assert [{k: c[k] for k in ("kind", "position", "requests")} for c in data["causes"]] == [
        {"kind": "reordered_keys", "position": 26, "requests": [6]},
        {"kind": "timestamp_or_id", "position": 16, "requests": [5, 9]},
        {"kind": "system_prompt_changed", "position": 31, "requests": [11]}]
    out = run_kvemu("audit", str(resolve_log(SAMPLE_LOG)), "--mode", "radix-1", "--pairs", "3")
    assert out.returncode == 0 and out.stderr == ""
    assert "  radix-1 *              857       0.359       0.557" in out.stdout
    assert "pairs (cached tokens per mode): 3 of 9, --pairs N" in out.stdout
    assert "timestamp_or_id in message 0 (system)" in out.stdout


def test_help_says_what_is_assumed_and_how_it_is_counted():
    out = run_kvemu("audit", "--help")
    assert out.returncode == 0
    text = " ".join(out.stdout.split())
    for words in ("previous prompt cached (the prompt, not its response)", "Token hit ratio = sum of cached tokens",
                  "min(common, previous prompt's length) // B * B", "blocks-16, vLLM's default block size"):
        assert words in text, words


@pytest.mark.parametrize("content, message", [
    ('{"messages": [{"role": "user", "content": "x"}]}\n{"messages": [\n', "{path}:2: field 'line': malformed JSON (Expecting value)"),
    ('"a string"\n', "{path}:1: field 'line': expected an object, got str"),
    ('{"messages": [{"role": "robot", "content": "x"}]}\n', "{path}:1: field 'messages[0].role': unknown role 'robot'"),
    ("[" * 1100 + "]" * 1100 + "\n", "{path}:1: field 'line': nested too deeply"),
    ("", "log: {path} holds no requests (the file is empty or every line is blank)"),
])
def test_bad_input_is_one_error_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    out = run_kvemu("audit", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr and out.stdout == ""
    assert out.stderr.splitlines() == [f"error: {message.format(path=path)}"]


def test_a_missing_file_and_a_bad_flag(tmp_path):
    out = run_kvemu("audit", str(tmp_path / "nope.jsonl"))
    assert out.returncode == 2 and out.stderr.splitlines() == [
        f"error: log: no file {tmp_path / 'nope.jsonl'}; give a request log's path, or prompt-log-sample for the sample"]
    out = run_kvemu("audit", SAMPLE_LOG, "--pairs", "-1")
    assert out.returncode == 2 and "Traceback" not in out.stderr and "expected an integer >= 0" in out.stderr
