"""kvemu's scheduler step for step with vLLM's own (docs/vllm-conformance.md): each golden file under
vllm_golden/ is a workload and the steps vLLM's v1 scheduler took on it, recorded by
bench/record_vllm_steps.py --all; kvemu's scheduler must take the same steps (no vLLM here)."""

import json
from pathlib import Path

import pytest

from replica.core.sched.steptrace import compare, kvemu_trace, piece_tokens

GOLDEN = Path(__file__).parent / "vllm_golden"
FILES = sorted(GOLDEN.glob("*.jsonl"))


def read(path: Path) -> tuple[dict, list[dict]]:
    lines = path.read_text().splitlines()
    return json.loads(lines[0]), [json.loads(x) for x in lines[1:]]


def test_the_golden_files_cover_the_cases_the_issue_names():
    names = {p.stem for p in FILES}
    assert len(names) >= 12
    for must in ("preempted_mid_prefill", "overlapping_turns", "multi_turn_chat",
                 "shared_prefix_together", "shared_prefix_apart", "long_prompts_beside_decodes", "small_pool_preempts",
                 "prefix_caching_off", "max_num_seqs_binding", "abort_mid_prefill", "abort_mid_decode",
                 "over_model_len"):
        assert must in names
    for p in FILES:
        header, steps = read(p)
        assert header["vllm"] == "0.33.0" and header["workload"]["name"] == p.stem and steps


def test_the_cases_exercise_what_they_are_named_for():
    # recorded from vLLM: a file whose case stopped happening (no preemption, no refusal) tests nothing
    def total(name, key):
        return sum(len(s[key]) for s in read(GOLDEN / f"{name}.jsonl")[1])
    assert total("small_pool_preempts", "preempted") >= 3
    assert total("prefix_caching_off_small_pool", "preempted") >= 1
    assert total("over_model_len", "refused") == 1
    assert total("abort_mid_prefill", "aborted") == total("abort_mid_decode", "aborted") == 1
    mid = read(GOLDEN / "preempted_mid_prefill.jsonl")[1]
    cut = next(s["step"] for s in mid if s["preempted"] == ["long"])
    assert mid[cut - 1]["scheduled"]["long"] == 63  # a chunk, its prompt not done
    # re-admitted, it finds the blocks its chunks computed (1,936 of its 2,100 tokens), not the ones it never reached
    assert [s["cached"] for s in mid if "long" in s["cached"]] == [{"long": 0}, {"long": 1936}]
    hits = read(GOLDEN / "shared_prefix_together.jsonl")[1][0]["cached"]
    assert hits == {"a0": 0, "a1": 512, "a2": 512, "a3": 512}  # admitted in one step, behind a0's blocks
    off = read(GOLDEN / "prefix_caching_off.jsonl")[1][0]["cached"]
    assert set(off.values()) == {0}
    # a turn arriving at step 150 while the one before still decodes: t1's 18 prompt blocks and the 10
    # response blocks its decoding filled by then (300 + 150 tokens' KV), not the prompt's 288 tokens only
    overlap = read(GOLDEN / "overlapping_turns.jsonl")[1]
    assert overlap[150]["cached"] == {"t2": 448} and "t1" in overlap[150]["scheduled"]
    header, chat = read(GOLDEN / "multi_turn_chat.jsonl")
    reqs = header["workload"]["requests"]
    done = {rid: s["step"] for s in chat for rid in s["finished"]}
    early = [r for r in reqs if not r["id"].endswith("t0")
             and done[r["id"][:r["id"].index("t")] + f"t{int(r['id'].split('t')[1]) - 1}"] > r["arrive"]]
    assert len(reqs) == 200 and len(early) == 103  # next turns that arrive while the turn before decodes


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_kvemu_takes_the_steps_vllm_took(path):
    header, steps = read(path)
    ours = kvemu_trace(header["workload"])
    first = compare(ours, steps)["first_difference"]
    if first is not None:
        theirs = steps[first] if first < len(steps) else None
        mine = ours[first] if first < len(ours) else None
        pytest.fail(f"step {first}: kvemu {mine} != vLLM {theirs}")


def test_pieces_make_shared_prefixes_token_for_token():
    a, b = piece_tokens([[1, 20], [2, 5]]), piece_tokens([[1, 20], [3, 5]])
    assert a[:20] == b[:20] and a[20:] != b[20:] and len(a) == 25
    assert piece_tokens([[1, 3]]) == [(1_000_003 + 1) % 30_000 + 1, (1_000_003 + 7_920) % 30_000 + 1,
                                      (1_000_003 + 15_839) % 30_000 + 1]


def test_compare_counts_agreeing_steps_and_the_first_difference():
    step = {"step": 0, "scheduled": {"a": 1}, "cached": {}, "preempted": [], "finished": [], "refused": [],
            "aborted": []}
    other = {**step, "preempted": ["a"]}
    assert compare([step, step], [step, other]) == {"steps": 2, "agree": 1, "first_difference": 1,
                                                    "preemptions_kvemu": 0, "preemptions_vllm": 1}
    assert compare([step], [step, step])["first_difference"] == 1
