"""The agent preset's fan-outs (loadgen/presets/fanout.py): a hand-worked plan of three parallel tool calls joined
by the parent's next turn (exact names, waits, gaps, recorded times and shared blocks), and the seeded preset."""

from __future__ import annotations

import numpy as np
import pytest

from loadgen.dependencies import check_dependencies
from loadgen.presets.build import build_requests
from loadgen.presets.common import SessionBatch
from loadgen.presets.fanout import TOOLS, Child, FanOut, with_fanouts
from loadgen.presets.interactive import AgentProfile
from loadgen.workloads import generate, get_preset
from shared.errors import InputError

BS = 4
# turn 0's answer calls three tools at once; turn 1 joins them, its prompt 4 tokens of its own + their 10 results
FAN = FanOut(0, TOOLS, (Child((4,), (2,), (0.5,)), Child((8,), (4,), (1.5,)), Child((4,), (4,), (1.0,))))


def _batch(fanouts) -> SessionBatch:
    return SessionBatch(kind=np.array(["agent"]), start=np.array([10.0]), turns=np.array([3]), sys_idx=np.array([-1]),
                        prompt=np.array([8, 4 + FAN.results(), 4]), output=np.array([4, 4, 4]),
                        gap=np.array([0.0, 2.0, 1.0]), sys_tokens=np.zeros(0, dtype=np.int64), sys_labels=[],
                        fanouts=fanouts)


def test_a_fan_out_of_three_joined_by_a_fourth():
    reqs = build_requests(_batch({0: (FAN,)}), BS, "t")
    s = "agent-000000"
    # (id, after, gap_s, t, input tokens, turn): children arrive their gap after turn 0 (t 10), the join its gap
    # (2.0) after the last child (11.5), turn 2 its gap after the join; turns numbered in time order
    assert [(r.id, r.after, r.gap_s, r.t, r.input_tokens, r.turn) for r in reqs] == [
        (f"{s}/0", (), 0.0, 10.0, 8, 0),
        (f"{s}/0.0/0", (f"{s}/0",), 0.5, 10.5, 16, 1),
        (f"{s}/0.2/0", (f"{s}/0",), 1.0, 11.0, 16, 2),
        (f"{s}/0.1/0", (f"{s}/0",), 1.5, 11.5, 20, 3),
        (f"{s}/1", (f"{s}/0.0/0", f"{s}/0.1/0", f"{s}/0.2/0"), 2.0, 13.5, 8 + 4 + 14, 4),
        (f"{s}/2", (f"{s}/1",), 1.0, 14.5, 26 + 4 + 4, 5),
    ]
    assert {r.session for r in reqs} == {s} and {r.kind for r in reqs} == {"agent"}
    parent, c0, c2, c1, join, _ = reqs
    # the children share turn 0's prompt and answer (12 tokens: 3 full blocks), then part from it and each other
    shared = join.hash_ids[:3]
    assert parent.hash_ids == shared[:2]
    for child, n in ((c0, 4), (c1, 5), (c2, 4)):
        assert len(child.hash_ids) == n and child.hash_ids[:3] == shared and child.hash_ids[3] != join.hash_ids[3]
    assert len({c0.hash_ids[3], c1.hash_ids[3], c2.hash_ids[3]}) == 3
    check_dependencies("plan", reqs, range(1, len(reqs) + 1))


def test_a_session_without_fan_out_is_as_before():
    reqs = build_requests(_batch(None), BS, "t")
    assert [(r.id, r.after, r.t, r.turn) for r in reqs] == [(None, (), 10.0, 0), (None, (), 12.0, 1), (None, (), 13.0, 2)]


def test_the_join_carries_the_results_and_children_stop_at_the_context_window():
    # every turn fans out to subagents; a window of 5,000 tokens cuts the session and the subagents' chains
    p = AgentProfile(system_prompts=0, tool_fanout_prob=0.0, subagent_prob=1.0, max_context=5000, turns_median=6,
                     turns_mean=8)
    rng = np.random.default_rng(4)
    base = np.random.default_rng(4)
    plain = AgentProfile(system_prompts=0, tool_fanout_prob=0.0, subagent_prob=0.0, max_context=5000, turns_median=6,
                         turns_mean=8).sample(base, np.array([0.0, 1.0]))
    fanned = p.sample(rng, np.array([0.0, 1.0]))
    assert fanned.fanouts
    for s, fans in fanned.fanouts.items():
        first, was = int(fanned.offsets()[s]), int(plain.offsets()[s])
        for f in fans:
            assert fanned.prompt[first + f.turn + 1] == plain.prompt[was + f.turn + 1] + f.results()
            assert f.turn + 1 < fanned.turns[s]
    reqs = build_requests(fanned, 16, "t")
    assert all(r.input_tokens <= 5000 or r.id.endswith("/0") for r in reqs)


def test_the_preset_is_seeded_and_its_children_keep_the_parents_session():
    a, b = generate("agent", 300, seed=2), generate("agent", 300, seed=2)
    assert [(r.id, r.after, r.t, r.hash_ids) for r in a.requests] == [(r.id, r.after, r.t, r.hash_ids) for r in b.requests]
    by_id = {r.id: r for r in a.requests if r.id}
    children = [r for r in a.requests if r.id and "." in r.id.rsplit("/", 2)[-2]]
    assert children
    for c in children:
        parent = by_id[c.id.rsplit(".", 1)[0]]
        assert c.session == parent.session
    check_dependencies("agent", a.requests, range(1, len(a.requests) + 1))
    # each request extends the one of its own line before it: its turn before, or a child's parent turn
    for r in a.requests:
        if r.id and r.after:
            line, _, k = r.id.rpartition("/")
            before = by_id[f"{line}/{int(k) - 1}" if int(k) else line.rsplit(".", 1)[0]]
            assert r.hash_ids[:len(before.hash_ids)] == before.hash_ids and r.t >= before.t


def test_mix_keeps_its_sequential_agents_and_bad_fan_out_parameters_are_named():
    assert not any(r.after for r in generate("mix", 300, seed=1).requests)
    assert get_preset("mix", {"agent.subagent_prob": "0.05"}).agent.subagent_prob == 0.05
    for over, field in (({"tool_fanout_prob": "0.7", "subagent_prob": "0.5"}, "tool_fanout_prob+subagent_prob"),
                        ({"tool_calls_mean": "1.5"}, "tool_calls_mean"), ({"subagents_mean": "0.5"}, "subagents_mean")):
        with pytest.raises(InputError) as err:
            get_preset("agent", over)
        assert err.value.field == field


def test_no_fan_out_draws_nothing():
    p = AgentProfile(tool_fanout_prob=0.0, subagent_prob=0.0)
    batch = _batch(None)
    assert with_fanouts(np.random.default_rng(0), batch, p) is batch
