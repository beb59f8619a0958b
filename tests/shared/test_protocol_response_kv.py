"""What a response's KV hashes to: the blocks a client continuing the conversation sends next."""

from shared import protocol, tokenizer

LIMITS = (1 << 20, 4096)


def chat(messages, max_tokens):
    return protocol.parse_openai({"messages": messages, "max_tokens": max_tokens}, True, 16, LIMITS, None)


def test_a_chat_response_hashes_to_the_next_turns_blocks_at_those_depths():
    first = [{"role": "system", "content": "you are a helpful assistant " * 8},
             {"role": "user", "content": "tell me about prefix caching " * 5}]
    spec = chat(first, 100)
    assert spec.response_hashes and len(spec.response_hashes) >= 6  # ~100 words complete several blocks
    words = tokenizer.filler_text(100, protocol.response_seed(spec.hashes, spec.prompt_tokens))
    nxt = chat(first + [{"role": "assistant", "content": words}, {"role": "user", "content": "and then?"}], 10)
    k = len(spec.hashes)
    assert nxt.hashes[:k] == spec.hashes
    assert nxt.hashes[k:k + len(spec.response_hashes)] == spec.response_hashes


def test_a_trace_client_says_what_the_response_hashes_to_and_bad_values_name_the_field():
    spec = protocol.parse_generate({"block_hashes": [1, 2], "max_tokens": 40, "response_block_hashes": [3, 4]},
                                   16, LIMITS, None)
    assert spec.response_hashes == [3, 4]
    assert protocol.parse_generate({"block_hashes": [1, 2]}, 16, LIMITS, None).response_hashes is None
    for bad in ("x", [-1], [1.5], [None]):
        try:
            protocol.parse_generate({"block_hashes": [1], "response_block_hashes": bad}, 16, LIMITS, None)
        except protocol.InputError as exc:
            assert exc.field.startswith("response_block_hashes")
        else:
            raise AssertionError(bad)


def test_token_ids_with_the_response_tokens_hash_the_full_blocks_the_response_completes():
    from shared.hashing import block_hashes

    prompt, response = list(range(20)), list(range(100, 130))  # 20 + 30 tokens: blocks of 16 end at 16, 32, 48
    spec = protocol.parse_generate({"token_ids": prompt, "max_tokens": 30, "response_token_ids": response},
                                   16, LIMITS, None)
    whole = block_hashes(prompt + response, 16)
    assert spec.hashes == whole[:1]  # the prompt fills one block; its 4-token tail is the response's first block
    assert spec.response_hashes == whole[1:3]  # the blocks ending at 32 and 48; the last 2 tokens fill none
    assert spec.block_tokens == prompt + response
    assert protocol.parse_generate({"token_ids": prompt}, 16, LIMITS, None).response_hashes is None
    try:
        protocol.parse_generate({"token_ids": prompt, "response_token_ids": [1, -2]}, 16, LIMITS, None)
    except protocol.InputError as exc:
        assert exc.field == "response_token_ids[1]"
    else:
        raise AssertionError("a negative token id was taken")
