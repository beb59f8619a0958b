"""Radix matching live: replicas started with ``--matching radix --page-size 1`` behind a router that hashes
prompts the same way, driven by the official ``openai`` SDK; block hashes refused by name."""

import dataclasses
import json

import openai
import pytest

from kvemu import api
from loadgen.trace import Trace
from tests.support.cluster import start_router, stop_all, wait_indexed
from tests.support.kvemu_cli import run_kvemu
from tests.support.procs import http, http_json, start_replica

pytestmark = pytest.mark.slow

RADIX = ("--matching", "radix", "--page-size", "1")
SYSTEM = "You are a careful assistant. Answer in one short paragraph, citing the manual where you can."


@pytest.fixture(scope="module")
def cluster():
    replicas = [start_replica(*RADIX, capacity_blocks=50_000) for _ in range(2)]
    router = start_router([r.url for r in replicas], *RADIX)
    yield router, replicas
    stop_all(router, *replicas)


def _chat(client, question: str):
    return client.chat.completions.with_raw_response.create(
        model="kvemu", max_tokens=4, messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])


def test_a_radix_replica_reuses_a_prompt_to_the_token_where_two_prompts_part(cluster):
    router, replicas = cluster
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=30)
    first = _chat(client, "How do I rotate the logs?")
    wait_indexed(router.url, [r.url for r in replicas])
    second = _chat(client, "How do I rotate the keys?")
    # the router's index saw the first prompt token by token and sends the second to the same replica
    assert second.headers["X-Kvemu-Replica"] == first.headers["X-Kvemu-Replica"]
    done = second.parse()
    # Both render to the same tokens up to "logs" / "keys": every token before it is reused, none
    # after (with blocks of 16 the reuse would stop at the last whole block before it).
    _, a = http_json("POST", replicas[0].url + "/tokenize", {"messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "How do I rotate the logs?"}]})
    _, b = http_json("POST", replicas[0].url + "/tokenize", {"messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": "How do I rotate the keys?"}]})
    common = next(i for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y)
    assert done.usage.prompt_tokens_details.cached_tokens == common
    assert common % 16 != 0  # so blocks of 16 would have reused less


def test_a_radix_replica_refuses_block_hashes_and_says_what_to_send(cluster):
    _, replicas = cluster
    status, _, body = http("POST", replicas[0].url + "/generate", {"block_hashes": [1, 2, 3], "max_tokens": 1})
    assert status == 400
    assert b"block_hashes" in body and b"token_ids" in body
    status, body = http_json("POST", replicas[0].url + "/generate", {"token_ids": list(range(40)), "max_tokens": 1})
    assert status == 200
    _, health = http_json("GET", replicas[0].url + "/health")
    assert (health["matching"], health["block_size"]) == ("radix", 1)


def test_a_preset_replayed_on_radix_replicas_goes_as_tokens_and_hits_as_the_simulator_says(cluster, tmp_path):
    """What each replica was sent (the router's decisions, whatever a loaded machine's timing made them),
    simulated on one replica in the order it was sent: every replica's hits are the simulator's, to the
    token. One connection: one request in flight at a time, so each replica saw its requests in that order
    and each finished before the next left (a decision of the replica's, not a race on the machine)."""
    router, _ = cluster
    preset = ("--workload", "chat", "--duration", "15", "--set", "session_rate=1", "--seed", "3")
    done = run_kvemu("replay", "--url", router.url, *preset, "--speedup", "200", "--connections", "1", "--quiet",
                     "--json", str(tmp_path / "live.json"), timeout=120)
    assert done.returncode == 0, done.stderr
    live = json.loads((tmp_path / "live.json").read_text())
    assert live["summary"]["failed"] == 0
    # the replay cut the preset into pages of one token, as the replicas match (kvemu replay asks them)
    trace = api.generate_trace("chat", duration_s=15, seed=3, session_rate=1, block_size=1)
    assert len(live["records"]) == len(trace.requests) == 30
    by_turn = {(r.session, r.turn): r for r in trace.requests}
    sent: dict[str, list] = {}
    for rec in sorted(live["records"], key=lambda rec: rec["sent_at_s"]):
        sent.setdefault(rec["replica"], []).append(rec)
    for replica, recs in sent.items():
        # as sent: each request at the time it left, so the simulator takes them in that order
        mine = Trace([dataclasses.replace(by_turn[(rec["session"], rec["turn"])], t=rec["sent_at_s"]) for rec in recs],
                     block_size=1, source=f"sent to {replica}", meta=dict(trace.meta))
        run = api.simulate(mine, capacity_blocks=[50_000], matching="radix", hit_mode="prefix", cache_only=True)[0]
        prompt_tokens = sum(rec["prompt_tokens"] for rec in recs)
        assert run["block_accesses"] == prompt_tokens  # pages of one token: one access a prompt token
        # the replica kept each response's KV from the tokens the replay said it would be: next turns hit it
        assert sum(rec["cached_tokens"] for rec in recs) == round(run["token_hit_ratio"] * prompt_tokens), replica


def test_a_router_that_hashes_in_other_units_says_so_in_its_log(cluster):
    _, replicas = cluster
    router = start_router([r.url for r in replicas])  # blocks of 16, the default
    try:
        wait_indexed(router.url, [r.url for r in replicas])
    finally:
        router.stop()
    log = router.proc.stderr.read().decode()
    assert "matches by radix of 1 tokens but this router hashes blocks of 16" in log
    assert "--matching / --page-size / --block-size" in log


def _stats_and_stderr(*flags: str, capacity_blocks: int | None = None):
    from tests.conftest import free_port
    from tests.support.procs import Proc

    port = free_port()
    capacity = ("--capacity-blocks", str(capacity_blocks)) if capacity_blocks else ()
    rep = Proc(["-m", "kvemu", "replica", "--port", str(port), "--time-scale", "0", *capacity, *flags], port)
    try:
        rep.wait_healthy()
        _, stats = http_json("GET", rep.url + "/stats")
    finally:
        rep.stop()
    assert rep.proc.stderr is not None
    return stats, rep.proc.stderr.read().decode()


def test_stats_report_capacity_in_the_pools_unit_and_in_tokens_and_bytes():
    """--capacity-blocks 100 is 100 blocks of 16 tokens under radix too: 1,600 pages of one token;
    --capacity-tokens 1000 is 62 blocks of 16 (992 tokens), which the replica says at start.
    qwen3-coder-30b-a3b's KV: 98,304 bytes a token."""
    stats, err = _stats_and_stderr(*RADIX, capacity_blocks=100)
    assert (stats["capacity_blocks"], stats["block_size"]) == (1600, 1)
    assert (stats["capacity_tokens"], stats["capacity_bytes"]) == (1600, 1600 * 98_304)
    assert stats["capacity_gib"] == pytest.approx(1600 * 98_304 / 2**30)
    assert "(lru, 1600 pages)" in err and "note:" not in err
    stats, err = _stats_and_stderr("--capacity-tokens", "1000", "--max-model-len", "512")
    assert (stats["capacity_blocks"], stats["block_size"], stats["capacity_tokens"]) == (62, 16, 992)
    assert stats["capacity_bytes"] == 992 * 98_304
    assert ("note: --capacity-tokens 1,000 is not a whole number of blocks of 16 tokens: the pool holds 62"
            " (992 tokens)") in err.splitlines()
