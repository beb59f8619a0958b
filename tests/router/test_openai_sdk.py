"""The router driven by the official ``openai`` SDK, as a user's client would drive it.

Models, completions, chat with an agent-style history (tool calls, tool results, content
parts), streaming with usage, cached tokens growing turn by turn, and requests for what
kvemu does not emulate refused with a 400 naming the option.
"""

import openai
import pytest

from tests.support.cluster import metric, scrape, start_router, stop_all, wait_indexed
from tests.support.procs import http_json, start_replica

MODEL = "qwen3-coder-30b-a3b"


@pytest.fixture(scope="module")
def cluster():
    reps = [start_replica(capacity_blocks=4000, replica_id=f"sdk{i}") for i in range(2)]
    router = start_router([r.url for r in reps], routing="cache_aware")
    try:
        yield router, reps
    finally:
        stop_all(router, *reps)


@pytest.fixture(scope="module")
def client(cluster):
    router, _ = cluster
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_models_list_on_router_and_replica(cluster, client):
    assert [m.id for m in client.models.list()] == [MODEL]
    _, reps = cluster
    status, body = http_json("GET", reps[0].url + "/v1/models")
    assert status == 200 and [m["id"] for m in body["data"]] == [MODEL] and body["object"] == "list"


def test_completion_and_streamed_text_are_identical(client):
    prompt = "the same completion prompt for both modes " * 4
    plain = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12)
    assert plain.usage.completion_tokens == 12 and len(plain.choices[0].text.split(" ")) == 12
    pieces, finish, usage = [], None, None
    for chunk in client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, stream=True,
                                           stream_options={"include_usage": True}):
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        else:
            usage = chunk.usage
    assert "".join(pieces) == plain.choices[0].text  # the request id seeds both: identical words
    assert finish == "length" and usage.completion_tokens == 12 and usage.prompt_tokens == plain.usage.prompt_tokens


def test_chat_stream_text_matches_and_usage_only_when_asked(client):
    msgs = [{"role": "user", "content": "stream a chat answer please"}]
    plain = client.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=9)
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=9, stream=True))
    assert all(c.usage is None for c in chunks) and all(c.choices for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == plain.choices[0].message.content and len(text.split(" ")) == 9
    chunks = list(client.chat.completions.create(model=MODEL, messages=msgs, max_completion_tokens=9, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 9
    assert all(c.usage is None for c in chunks[:-1])


def test_agent_history_with_tool_calls_and_cached_tokens_growing(cluster, client):
    tools = [{"type": "function", "function": {"name": "read_file", "description": "read a file",
                                               "parameters": {"type": "object", "properties": {
                                                   "path": {"type": "string"}}}}}]
    history = [{"role": "system", "content": "You are a coding agent working in a large repository. " * 20},
               {"role": "user", "content": [{"type": "text", "text": "Fix the failing test in "},
                                            {"type": "text", "text": "tests/test_pool.py please."}]}]
    cached, prompts = [], []
    router, reps = cluster
    for turn in range(4):
        out = client.chat.completions.create(model=MODEL, messages=history, tools=tools, max_tokens=4,
                                             extra_headers={"X-Session-Id": "sdk-agent"})
        cached.append(out.usage.prompt_tokens_details.cached_tokens)
        prompts.append(out.usage.prompt_tokens)
        wait_indexed(router.url, [r.url for r in reps])  # the router knows where the turn's blocks are
        call_id = f"call_{turn}"
        history.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "read_file",
                                                            "arguments": f'{{"path": "src/mod{turn}.py"}}'}}]})
        history.append({"role": "tool", "tool_call_id": call_id, "content": f"contents of module {turn} " * 30})
    # each turn reuses every full block of the previous turn's prompt (16-token blocks)
    assert cached == [0] + [p // 16 * 16 for p in prompts[:-1]], (cached, prompts)


@pytest.mark.parametrize("kwargs,param", [
    ({"n": 2}, "n"),
    ({"stop": ["\n"]}, "stop"),
    ({"logprobs": 2}, "logprobs"),
    ({"prompt": ["one prompt", "another prompt"]}, "prompt"),
    ({"echo": True}, "echo"),
])
def test_unemulated_options_are_refused_by_name(client, kwargs, param):
    args = {"model": MODEL, "prompt": "refuse me", "max_tokens": 2, **kwargs}
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(**args)
    assert err.value.status_code == 400 and err.value.body["param"] == param
    if param == "prompt":
        assert "batches are not supported" in err.value.body["message"]


def test_chat_options_refused_by_name(client):
    msgs = [{"role": "user", "content": "hi"}]
    for kwargs, param in (({"logprobs": True}, "logprobs"), ({"n": 3}, "n"), ({"stop": "END"}, "stop"),
                          ({"stream_options": {"include_usage": True}}, "stream_options")):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=2, **kwargs)
        assert err.value.body["param"] == param
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=image, max_tokens=2)
    assert err.value.body["param"] == "messages[0].content[0].type"


def test_router_metrics_carry_the_cluster_vllm_series(cluster, client):
    """After known traffic, the router's /metrics has every replica's vLLM series, labelled."""
    router, reps = cluster
    before = scrape(router.url)
    for i in range(3):
        client.completions.create(model=MODEL, prompt=f"metrics probe number {i} " * 10, max_tokens=5)
    after = scrape(router.url)

    def delta(name, **labels):
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("vllm:request_success_total", finished_reason="length") == 3
    assert delta("vllm:generation_tokens_total") == 15
    assert delta("vllm:e2e_request_latency_seconds_count") == 3
    assert delta("vllm:time_per_output_token_seconds_count") == 3
    assert delta("vllm:time_to_first_token_seconds_count") == 3
    assert delta("vllm:prompt_tokens_total") > 0
    assert metric(after, "vllm:num_preemptions_total") == 0
    assert metric(after, "kvemu_router_requests_total", outcome="ok") >= 3  # the router's own, alongside
    ids = {dict(lab).get("replica_id") for (n, lab) in after if n.startswith("vllm:")}
    assert ids == {"sdk0", "sdk1"}
    # every vLLM series names its model and its replica, on the router and on each replica
    for samples in (after, scrape(reps[0].url)):
        for (name, lab) in samples:
            if name.startswith("vllm:"):
                assert dict(lab).get("model_name") == MODEL and dict(lab).get("replica_id"), (name, lab)
