"""Tool definitions render in the client's order, keys included, as real chat templates render them
(Hugging Face's ``tojson`` keeps the order it is given): the same tools sent in another order are
another prompt, as on a real server, where sorting them had made a reordering free."""

from __future__ import annotations

from shared import protocol, tokenizer

LIMITS = (100_000, 100)
MESSAGES = [{"role": "user", "content": "Weather in Oslo?"}]
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
FLIGHTS = {"type": "function", "function": {"name": "search_flights", "parameters": {"type": "object"}}}


def spec(tools):
    return protocol.parse_openai({"messages": MESSAGES, "tools": tools}, True, 16, LIMITS, None)


def test_tools_keep_the_clients_key_order():
    reordered = {"function": {"parameters": {"type": "object"}, "name": "get_weather"}, "type": "function"}
    assert protocol._tools({"tools": [reordered]}) == \
        '[{"function":{"parameters":{"type":"object"},"name":"get_weather"},"type":"function"}]'
    assert spec([WEATHER]).hashes[0] != spec([reordered]).hashes[0]  # the first block holds the tools
    assert spec([WEATHER]).hashes == spec([dict(WEATHER)]).hashes


def test_tools_in_another_order_are_another_prompt():
    a, b = spec([WEATHER, FLIGHTS]), spec([FLIGHTS, WEATHER])
    # they part at the first tool's name, token 26: the first block is shared, the second is not
    assert a.prompt_tokens == b.prompt_tokens and a.hashes[0] == b.hashes[0] and a.hashes[1] != b.hashes[1]
    text = tokenizer.chat_template(protocol._messages(MESSAGES), protocol._tools({"tools": [FLIGHTS, WEATHER]}))
    assert text.index("search_flights") < text.index("get_weather")
