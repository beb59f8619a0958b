"""Workload presets: determinism, block-hash chaining, and each preset's target statistics."""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict

import numpy as np
import pytest

from loadgen.presets.common import zipf_mandelbrot_probs
from loadgen.workloads import PRESETS, describe_presets, generate, get_preset, parameters
from shared.errors import InputError, UnknownNameError

# A block size far above every prompt: hashing becomes free and the token-level workload
# is unchanged (asserted below), so statistics tests can afford large samples.
HUGE_BLOCKS = "1048576"


def sessions_of(trace) -> dict[str, list]:
    by = defaultdict(list)
    for r in trace.requests:
        by[r.session].append(r)
    for reqs in by.values():
        reqs.sort(key=lambda r: r.turn)
    return by


def fingerprint(trace):
    return [(r.t, r.session, r.turn, tuple(r.hash_ids), r.input_tokens, r.output_tokens, r.kind)
            for r in trace.requests]


def quantiles(values, qs=(0.5, 0.9, 0.99)):
    return [float(np.quantile(values, q)) for q in qs]


# ---------------------------------------------------------------- every preset


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_trace_is_well_formed(name):
    duration = 900
    trace = generate(name, duration, seed=3)
    assert trace.requests, name
    assert trace.source == name and trace.block_size == 16
    assert trace.meta["workload"] == name and trace.meta["seed"] == 3 and trace.meta["duration_s"] == duration
    assert trace.meta["params"] == dataclasses.asdict(get_preset(name))
    times = [r.t for r in trace.requests]
    assert times == sorted(times) and times[0] >= 0
    for reqs in sessions_of(trace).values():
        assert [r.turn for r in reqs] == list(range(len(reqs)))
        assert reqs[0].t < duration
        assert len({r.kind for r in reqs}) == 1 and reqs[0].kind in ("single", "multi", "agent")
        for r in reqs:
            assert len(r.hash_ids) == r.input_tokens // 16
            assert len(set(r.hash_ids)) == len(r.hash_ids)
            assert all(0 <= h < 2**64 for h in r.hash_ids)
            assert r.input_tokens > 0 and r.output_tokens >= 0


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_same_seed_same_trace_other_seed_other_trace(name):
    a, b = generate(name, 600, seed=11), generate(name, 600, seed=11)
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(generate(name, 600, seed=12)) != fingerprint(a)


def test_different_seeds_share_no_session_blocks():
    a = {h for r in generate("chat", 600, seed=1).requests for h in r.hash_ids}
    b = {h for r in generate("chat", 600, seed=2).requests for h in r.hash_ids}
    assert not a & b


@pytest.mark.parametrize("name", ["chat", "agent", "mix", "freeinference", "scm"])
def test_each_turn_extends_the_previous_one(name):
    """Turn j+1's prompt = turn j's prompt + its response + a new prompt, so its hashes start
    with all of turn j's full-block hashes. (The agent's fan-outs branch off: tests/loadgen/test_agent_fanout.py.)"""
    no_fanout = {"tool_fanout_prob": "0", "subagent_prob": "0"} if name == "agent" else None
    trace = generate(name, 900, seed=5, overrides=no_fanout)
    multi_turn = 0
    for reqs in sessions_of(trace).values():
        for prev, cur in zip(reqs, reqs[1:]):
            multi_turn += 1
            assert cur.input_tokens > prev.input_tokens + prev.output_tokens
            assert cur.hash_ids[: len(prev.hash_ids)] == prev.hash_ids
            assert cur.t > prev.t
    assert multi_turn > 50


def test_hashes_are_chained_by_depth():
    """A chained hash fixes its depth and every block before it: a block shared by two
    prompts sits at the same depth in both, and so does its predecessor."""
    depth: dict[int, int] = {}
    parent: dict[int, int | None] = {}
    for r in generate("mix", 1200, seed=2).requests:
        for k, h in enumerate(r.hash_ids):
            assert depth.setdefault(h, k) == k
            assert parent.setdefault(h, r.hash_ids[k - 1] if k else None) == (r.hash_ids[k - 1] if k else None)


def test_block_size_changes_hashing_only():
    base = generate("chat", 900, seed=4)
    big = generate("chat", 900, seed=4, overrides={"block_size": "64"})
    assert big.block_size == 64
    assert [(r.t, r.session, r.input_tokens, r.output_tokens) for r in big.requests] == \
        [(r.t, r.session, r.input_tokens, r.output_tokens) for r in base.requests]
    assert all(len(r.hash_ids) == r.input_tokens // 64 for r in big.requests)


def test_progress_reports_completion():
    calls = []
    generate("single", 60, seed=1, progress=lambda done, total: calls.append((done, total)))
    assert calls and calls[-1][0] == calls[-1][1] > 0


# ---------------------------------------------------------------- system prompts and payloads


def test_single_shares_system_prompt_blocks_and_never_payload_blocks():
    # one 168-token prompt: 10 full blocks shared; block 10 straddles prompt and payload
    trace = generate("single", 600, seed=1, overrides={
        "system_prompts": "1", "system_median": "168", "system_sigma": "0", "request_rate": "2"})
    reqs = trace.requests
    assert len(reqs) > 500
    assert all(r.hash_ids[:10] == reqs[0].hash_ids[:10] for r in reqs)
    payload = Counter(h for r in reqs for h in r.hash_ids[10:])
    assert payload and max(payload.values()) == 1


def test_chat_sessions_share_only_their_system_prompt():
    trace = generate("chat", 1200, seed=1, overrides={
        "system_prompts": "1", "system_median": "64", "system_sigma": "0"})
    first = [reqs[0] for reqs in sessions_of(trace).values()]
    assert len(first) > 100
    assert all(r.hash_ids[:4] == first[0].hash_ids[:4] for r in first)
    owners = defaultdict(set)
    for r in trace.requests:
        for h in r.hash_ids[4:]:
            owners[h].add(r.session)
    assert max(len(s) for s in owners.values()) == 1


def test_single_system_prompt_popularity_is_zipf_mandelbrot():
    trace = generate("single", 3600, seed=7, overrides={"request_rate": "5"})
    top = Counter(r.hash_ids[0] for r in trace.requests).most_common(3)
    share = [count / len(trace.requests) for _, count in top]
    p = zipf_mandelbrot_probs(200, 1.1, 2.7)
    assert share == pytest.approx(p[:3], rel=0.1)
    assert all(r.kind == "single" and r.turn == 0 for r in trace.requests)


# ---------------------------------------------------------------- scm


def test_scm_block_counts_are_exact():
    k, m = 3, 5
    trace = generate("scm", 3000, seed=2, overrides={"prompt_blocks": str(k), "response_blocks": str(m),
                                                     "block_size": "32", "block_tokens": "32"})
    for r in trace.requests:
        assert len(r.hash_ids) == r.turn * (k + m) + k
        assert r.input_tokens == 32 * len(r.hash_ids)
        assert r.output_tokens == 32 * m
        assert r.kind == "multi"


def test_scm_tokens_stay_the_same_whatever_block_size_hashes_them():
    # block_size is the hashing unit alone (--block-size / --page-size): 3 blocks of the model's 16
    # tokens are 48 tokens a prompt at any block size, 3 hashed blocks of 16, 48 pages of 1, 1 of 32
    base = {"prompt_blocks": "3", "response_blocks": "2", "continue_prob": "0"}
    by_size = {b: generate("scm", 600, seed=5, overrides={**base, "block_size": str(b)}) for b in (1, 16, 32)}
    for b, trace in by_size.items():
        assert {(r.input_tokens, r.output_tokens) for r in trace.requests} == {(48, 32)}
        assert {len(r.hash_ids) for r in trace.requests} == {48 // b}
    assert len(by_size[1].requests) == len(by_size[16].requests) > 0


def test_scm_turns_arrivals_and_think_time_match_the_model():
    p, rate, think, duration = 0.8, 2.0, 40.0, 20_000
    trace = generate("scm", duration, seed=9, overrides={
        "continue_prob": str(p), "arrival_rate": str(rate), "think_mean": str(think),
        "prompt_blocks": "1", "response_blocks": "1", "block_size": HUGE_BLOCKS})
    sessions = sessions_of(trace)
    turns = np.array([len(reqs) for reqs in sessions.values()])
    assert len(sessions) / duration == pytest.approx(rate, rel=0.02)
    assert turns.mean() == pytest.approx(1 / (1 - p), rel=0.03)
    # geometric: P(M >= 2) = p
    assert (turns >= 2).mean() == pytest.approx(p, abs=0.01)
    gaps = np.concatenate([np.diff([r.t for r in reqs]) for reqs in sessions.values() if len(reqs) > 1])
    assert gaps.mean() == pytest.approx(think, rel=0.03)
    starts = np.sort([reqs[0].t for reqs in sessions.values()])
    assert starts[-1] < duration
    # Poisson arrivals: exponential inter-arrival times, coefficient of variation 1
    inter = np.diff(starts)
    assert inter.std() / inter.mean() == pytest.approx(1.0, abs=0.05)


def test_scm_accepts_every_parameter_by_name():
    values = {"arrival_rate": "0.7", "think_mean": "12.5", "continue_prob": "0.25", "prompt_blocks": "2",
              "response_blocks": "0", "block_size": "8", "block_tokens": "8", "max_turns": "3"}
    params = get_preset("scm", values)
    assert (params.arrival_rate, params.think_mean, params.continue_prob) == (0.7, 12.5, 0.25)
    assert (params.prompt_blocks, params.response_blocks, params.block_size, params.block_tokens,
            params.max_turns) == (2, 0, 8, 8, 3)
    trace = generate("scm", 600, seed=1, overrides=values)
    assert trace.block_size == 8
    assert all(len(r.hash_ids) == 2 * (r.turn + 1) and r.turn < 3 for r in trace.requests)


# ---------------------------------------------------------------- chat, agent, mix


def test_chat_turns_have_median_3_and_mean_7():
    trace = generate("chat", 10_000, seed=1, overrides={"session_rate": "2", "block_size": HUGE_BLOCKS})
    turns = np.array([len(reqs) for reqs in sessions_of(trace).values()])
    assert len(turns) > 15_000
    assert np.median(turns) == 3
    assert turns.mean() == pytest.approx(7.0, rel=0.06)
    gaps = np.concatenate([np.diff([r.t for r in reqs]) for reqs in sessions_of(trace).values()])
    assert 10 <= np.median(gaps) <= 60  # tens of seconds


def test_agent_has_many_quick_turns_and_growing_context():
    trace = generate("agent", 3600, seed=1, overrides={"block_size": HUGE_BLOCKS})
    sessions = sessions_of(trace)
    turns = np.array([len(reqs) for reqs in sessions.values()])
    gaps = np.concatenate([np.diff([r.t for r in reqs]) for reqs in sessions.values()])
    assert np.median(turns) >= 10 and np.median(gaps) < 10
    assert all(r.kind == "agent" for r in trace.requests)
    last = [reqs[-1].input_tokens for reqs in sessions.values() if len(reqs) > 5]
    first = [reqs[0].input_tokens for reqs in sessions.values() if len(reqs) > 5]
    assert np.median(last) > 3 * np.median(first)


@pytest.mark.parametrize("fracs", [(1 / 3, 1 / 3, 1 / 3), (0.5, 0.3, 0.2), (0.0, 0.0, 1.0)])
def test_mix_session_fractions_and_request_rate(fracs):
    duration, rate = 7200, 10.0
    overrides = {"single_frac": str(fracs[0]), "multi_frac": str(fracs[1]), "agent_frac": str(fracs[2]),
                 "request_rate": str(rate), "block_size": HUGE_BLOCKS}
    trace = generate("mix", duration, seed=3, overrides=overrides)
    sessions = sessions_of(trace)
    kinds = Counter(reqs[0].kind for reqs in sessions.values())
    for kind, frac in zip(("single", "multi", "agent"), fracs):
        assert kinds[kind] / len(sessions) == pytest.approx(frac, abs=0.03)
    assert len(trace.requests) / duration == pytest.approx(rate, rel=0.15)


def test_mix_default_is_about_one_and_a_half_requests_per_second():
    trace = generate("mix", 3600 * 4, seed=1, overrides={"block_size": HUGE_BLOCKS})
    assert len(trace.requests) / (3600 * 4) == pytest.approx(1.5, rel=0.2)


def test_mix_profiles_are_set_with_dotted_names():
    params = get_preset("mix", {"multi.turns_mean": "8", "agent.gap_median": "1.5", "single.zipf_s": "0.9"})
    assert (params.multi.turns_mean, params.agent.gap_median, params.single.zipf_s) == (8.0, 1.5, 0.9)
    assert parameters(params)["multi.turns_mean"] == 8.0


# ---------------------------------------------------------------- freeinference


@pytest.fixture(scope="module")
def freeinference_trace():
    return generate("freeinference", 20_000, seed=1, overrides={"session_rate": "1", "block_size": HUGE_BLOCKS})


@pytest.mark.parametrize("stat, target", [
    ("gaps", (8.2, 47.0, 409.0)),
    ("turns", (5.0, 30.0, 168.0)),
    ("footprint", (45.0, 1500.0, 8300.0)),
])
def test_freeinference_matches_seed_002_quantiles(freeinference_trace, stat, target):
    sessions = sessions_of(freeinference_trace).values()
    multi = [reqs for reqs in sessions if len(reqs) > 1]
    values = {
        "gaps": np.concatenate([np.diff([r.t for r in reqs]) for reqs in multi]),
        "turns": [len(reqs) for reqs in multi],
        # distinct 16-token blocks of a session = full blocks of its longest prompt
        "footprint": [reqs[-1].input_tokens // 16 for reqs in sessions],
    }[stat]
    assert len(values) > 5000
    for got, want in zip(quantiles(values), target):
        assert got == pytest.approx(want, rel=0.25), (stat, quantiles(values), target)


def test_freeinference_footprint_is_the_hashed_block_count():
    trace = generate("freeinference", 1800, seed=2)
    for reqs in sessions_of(trace).values():
        assert len({h for r in reqs for h in r.hash_ids}) == reqs[-1].input_tokens // 16
    kinds = Counter(r.kind for r in trace.requests)
    assert set(kinds) == {"single", "multi"}


# ---------------------------------------------------------------- parameters and errors


def test_unknown_preset_lists_valid_names():
    with pytest.raises(UnknownNameError) as info:
        get_preset("nope")
    for name in PRESETS:
        assert name in str(info.value)
    with pytest.raises(UnknownNameError):
        generate("nope", 10)


@pytest.mark.parametrize("name, overrides, field", [
    ("scm", {"nope": "1"}, "nope"),
    ("scm", {"arrival_rate": "fast"}, "arrival_rate"),
    ("scm", {"arrival_rate": "0"}, "arrival_rate"),
    ("scm", {"arrival_rate": "nan"}, "arrival_rate"),
    ("scm", {"think_mean": "-1"}, "think_mean"),
    ("scm", {"continue_prob": "1"}, "continue_prob"),
    ("scm", {"continue_prob": "-0.1"}, "continue_prob"),
    ("scm", {"prompt_blocks": "0"}, "prompt_blocks"),
    ("scm", {"prompt_blocks": "1.5"}, "prompt_blocks"),
    ("scm", {"block_size": "0"}, "block_size"),
    ("chat", {"session_rate": "-2"}, "session_rate"),
    ("chat", {"turns_mean": "2"}, "turns_mean"),
    ("chat", {"gap_sigma": "-1"}, "gap_sigma"),
    ("agent", {"system_prompts": "-1"}, "system_prompts"),
    ("single", {"request_rate": "inf"}, "request_rate"),
    ("mix", {"single_frac": "1.5"}, "single_frac"),
    ("mix", {"single_frac": "0.5"}, "single_frac+multi_frac+agent_frac"),
    ("mix", {"multi.turns_median": "0"}, "multi.turns_median"),
    ("mix", {"multi.nope": "1"}, "multi.nope"),
    ("mix", {"agent": "1"}, "agent"),
    ("freeinference", {"gap_p90": "5"}, "gap_p90"),
    ("freeinference", {"turns_p50": "2"}, "turns_p50"),
    ("freeinference", {"single_frac": "2"}, "single_frac"),
    ("freeinference", {"size_turns_corr": "1"}, "size_turns_corr"),
])
def test_bad_parameters_name_the_field(name, overrides, field):
    with pytest.raises(InputError) as info:
        get_preset(name, overrides)
    assert info.value.field == field


@pytest.mark.parametrize("kwargs, field", [
    ({"duration_s": 0}, "duration"), ({"duration_s": float("nan")}, "duration"), ({"seed": -1}, "seed"),
])
def test_bad_duration_or_seed(kwargs, field):
    args = {"duration_s": 10, "seed": 0} | kwargs
    with pytest.raises(InputError) as info:
        generate("scm", **args)
    assert info.value.field == field


def test_describe_lists_every_preset_and_parameter():
    text = describe_presets()
    for name, cls in PRESETS.items():
        assert f"{name}:" in text
        for key in parameters(cls()):
            assert f"    {key}=" in text
