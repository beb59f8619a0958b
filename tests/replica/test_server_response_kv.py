"""--response-kv keep|drop on a real replica: the next chat turn hits the previous response's blocks."""

import pytest

from shared import protocol, tokenizer
from tests.support.procs import http_json, start_replica

pytestmark = pytest.mark.slow

FIRST = [{"role": "system", "content": "you are a helpful assistant " * 8},
         {"role": "user", "content": "tell me about prefix caching " * 5}]


@pytest.mark.parametrize("mode", ["keep", "drop"])
def test_the_next_turn_reuses_the_response_only_when_it_is_kept(mode):
    proc = start_replica("--response-kv", mode, capacity_blocks=500)
    try:
        status, first = http_json("POST", proc.url + "/v1/chat/completions", {"messages": FIRST, "max_tokens": 100})
        assert status == 200
        words = first["choices"][0]["message"]["content"]
        spec = protocol.parse_openai({"messages": FIRST, "max_tokens": 100}, True, 16, (1 << 20, 4096), None)
        assert words == tokenizer.filler_text(100, protocol.response_seed(spec.hashes, spec.prompt_tokens))
        second = FIRST + [{"role": "assistant", "content": words}, {"role": "user", "content": "and then?"}]
        status, out = http_json("POST", proc.url + "/v1/chat/completions", {"messages": second, "max_tokens": 5})
        cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
        prompt_blocks = len(spec.hashes) * 16
        expected = prompt_blocks + 16 * len(spec.response_hashes) if mode == "keep" else prompt_blocks
        assert cached == expected
    finally:
        assert proc.stop() == 0
