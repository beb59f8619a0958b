"""Bad bodies the fuzzer of issue 17 found: each is a 400 naming the field, never a crash."""

import json

import msgpack
import pytest

from shared import protocol
from shared.errors import InputError

LIMITS = (1_048_576, 65_536)


def _field(fn, *args) -> str:
    with pytest.raises(InputError) as err:
        fn(*args)
    return err.value.field


def test_deep_nesting_is_a_body_error_for_json_and_msgpack():
    assert _field(protocol.decode_body, b"[" * 100_000, "application/json") == "body"
    assert _field(protocol.decode_body, b'{"prompt":' + b"[" * 100_000, "application/json") == "body"
    assert _field(protocol.decode_body, b"\x91" * 100_000, protocol.MSGPACK) == "body"


def test_nested_too_deeply_names_the_body():
    with pytest.raises(InputError, match="nested too deeply"):
        protocol.decode_body(b"[" * 100_000, "application/json")


@pytest.mark.parametrize("name", ["max_tokens", "output_tokens"])
def test_null_token_counts_mean_the_default(name):
    spec = protocol.parse_generate({"token_ids": [1, 2, 3], name: None}, 16, LIMITS, None)
    assert spec.max_tokens == 1
    spec = protocol.parse_openai({"prompt": "hi", "max_tokens": None, "max_completion_tokens": None,
                                  "stream": None, "user": None, "model": None}, False, 16, LIMITS, None)
    assert (spec.max_tokens, spec.stream, spec.session, spec.model) == (16, False, None, "kvemu")


@pytest.mark.parametrize("body, chat, field", [
    ({"prompt": "hi", "max_tokens": 0}, False, "max_tokens"),
    ({"prompt": "hi", "max_completion_tokens": 0}, False, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, True, "max_tokens"),
])
def test_zero_max_tokens_is_refused(body, chat, field):
    assert _field(protocol.parse_openai, body, chat, 16, LIMITS, None) == field


@pytest.mark.parametrize("body, field", [
    ({"token_ids": [1], "max_tokens": 0}, "max_tokens"),
    ({"token_ids": [1], "output_tokens": 0}, "output_tokens"),
])
def test_zero_output_is_refused_on_generate(body, field):
    assert _field(protocol.parse_generate, body, 16, LIMITS, None) == field


@pytest.mark.parametrize("text, field", [
    (5, "messages[0].content[1].text"), ([1], "messages[0].content[1].text"),
    ({"a": 1}, "messages[0].content[1].text"), (True, "messages[0].content[1].text"),
])
def test_non_string_text_part(text, field):
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": text}]}]}
    assert _field(protocol.parse_openai, body, True, 16, LIMITS, None) == field


def test_non_object_content_part():
    body = {"messages": [{"role": "user", "content": ["plain"]}]}
    assert _field(protocol.parse_openai, body, True, 16, LIMITS, None) == "messages[0].content[0]"


def test_text_parts_are_joined_and_other_parts_refused_by_name():
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]}
    plain = {"messages": [{"role": "user", "content": "ab"}]}
    assert protocol.parse_openai(body, True, 16, LIMITS, None).hashes == \
        protocol.parse_openai(plain, True, 16, LIMITS, None).hashes
    body["messages"][0]["content"].insert(1, {"type": "image_url"})
    with pytest.raises(InputError) as err:
        protocol.parse_openai(body, True, 16, LIMITS, None)
    assert err.value.field == "messages[0].content[1].type"


def test_deep_values_inside_fields_are_field_errors():
    deep = json.loads("[" * 500 + "]" * 500)
    for body, field in (({"token_ids": deep}, "token_ids[0]"), ({"prompt": deep}, "prompt[0]"),
                        ({"stream": deep, "prompt": "x"}, "stream"), ({"user": deep, "prompt": "x"}, "user")):
        parse = protocol.parse_generate if "token_ids" in body else \
            (lambda b, *a: protocol.parse_openai(b, False, *a))
        assert _field(parse, body, 16, LIMITS, None) == field
    assert msgpack.packb(deep)  # the same shapes arrive as msgpack; decode_body is the only difference


@pytest.mark.parametrize("chat, field", [(False, "prompt"), (True, "messages")])
def test_a_lone_surrogate_in_a_prompt_is_a_400_naming_the_field(chat, field):
    # JSON may carry "\ud800", which has no UTF-8 form (it was a 500 with a traceback)
    body = ({"messages": [{"role": "user", "content": "a \ud800 b"}]} if chat else {"prompt": "a \ud800 b"})
    with pytest.raises(InputError, match="lone surrogate") as err:
        protocol.parse_openai(body, chat, 16, (1000, 100), None)
    assert err.value.field == field


def test_tools_nested_too_deeply_to_render_are_a_400_naming_them():
    import pytest as _pytest

    from shared import protocol as _protocol
    from shared.errors import InputError as _InputError

    depth = 1000  # within the decoder's limit, beyond what json.dumps can encode again
    raw = ('{"messages":[{"role":"user","content":"hi"}],"tools":' + "[" * depth + "]" * depth + "}").encode()
    obj = _protocol.decode_body(raw, "application/json")
    with _pytest.raises(_InputError, match="nested too deeply") as exc:
        _protocol.parse_openai(obj, True, 16, (1 << 20, 4096), None)
    assert exc.value.field == "tools"


@pytest.mark.parametrize("raw, ctype, field, shown", [
    (b'{"temperature": NaN}', "application/json", "temperature", "NaN"),
    (b'{"top_p": Infinity}', "application/json", "top_p", "Infinity"),
    (b'{"seed": -1e400}', "application/json", "seed", "-Infinity"),  # too large for a float: infinite
    (b'{"messages": [{"role": "user", "x": {"y": [1, NaN]}}]}', "application/json", "messages[0].x.y[1]", "NaN"),
    (msgpack.packb({"seed": float("-inf")}), protocol.MSGPACK, "seed", "-Infinity"),
    (msgpack.packb({"a": [1, {"b": float("nan")}]}, use_single_float=True), protocol.MSGPACK, "a[1].b", "NaN"),
])
def test_a_non_finite_number_anywhere_is_refused_naming_where(raw, ctype, field, shown):
    with pytest.raises(InputError) as err:
        protocol.decode_body(raw, ctype)
    assert (err.value.field, err.value.message) == (field, f"is {shown}; send a finite number (JSON has no NaN or"
                                                           " Infinity)")


def test_finite_floats_and_bytes_that_only_look_like_a_msgpack_nan_pass():
    assert protocol.decode_body(b'{"temperature": 0.7, "n": 1e308}', "application/json") == {"temperature": 0.7,
                                                                                              "n": 1e308}
    raw = msgpack.packb({"token_ids": [0xCB7FF0]})  # a float64 NaN's first bytes, inside an integer
    assert b"\xcb\x7f\xf0" in raw
    assert protocol.decode_body(raw, protocol.MSGPACK) == {"token_ids": [0xCB7FF0]}
