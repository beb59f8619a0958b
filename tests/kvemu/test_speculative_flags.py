"""kvemu/options/speculative.py: the flags give the scheduler's one setting; bad input is one line naming the flag."""

from __future__ import annotations

import argparse
import json

import pytest

from kvemu.cli import main
from kvemu.options.speculative import add_speculative_args, spec_decode
from replica.core.sched.spec_decode import SpecDecode
from shared.errors import InputError


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_speculative_args(p)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(list(argv))


def _drafting(method: str, tokens: str, *more: str) -> list[str]:
    """The flags of a drafter proposing ``tokens`` tokens, then ``more``."""
    return ["--speculative-method", method, "--num-speculative-tokens", tokens, *more]


def test_the_flags_give_the_setting():
    assert spec_decode(_parse()) is None
    got = spec_decode(_parse(*_drafting("eagle", "3", "--acceptance-rate", "0.7", "--seed", "5")))
    assert got == SpecDecode("eagle", 3, 0.7, (), seed=5) and got.lookahead == 3
    got = spec_decode(_parse(*_drafting("ngram", "2", "--acceptance-lengths", "0.5,0.25,0.25")))
    assert got is not None and got.acceptance_lengths == (0.5, 0.25, 0.25) and got.lookahead == 0


@pytest.mark.parametrize("argv, flag", [
    (["--num-speculative-tokens", "2"], "--num-speculative-tokens"),
    (["--acceptance-rate", "0.5"], "--acceptance-rate"),
    (_drafting("ngram", "-1", "--acceptance-rate", "0.5"), "--num-speculative-tokens"),
    (_drafting("ngram", "2", "--acceptance-rate", "0"), "--acceptance-rate"),
    (_drafting("ngram", "2", "--acceptance-rate", "1.2"), "--acceptance-rate"),
    (_drafting("mtp", "1", "--acceptance-lengths", "0.2,0.3,0.5"), "--acceptance-lengths"),
    (_drafting("mtp", "2", "--acceptance-lengths", "0.2,0.3"), "--acceptance-lengths"),
    (_drafting("draft", "2", "--acceptance-rate", "0.5"), "--speculative-method"),
])
def test_bad_input_is_one_line_naming_the_flag(argv, flag):
    with pytest.raises(InputError) as e:
        spec_decode(_parse(*argv))
    assert e.value.field == flag and "\n" not in str(e.value)


def test_a_method_without_k_says_what_to_add():
    with pytest.raises(InputError, match=r"^--num-speculative-tokens: --speculative-method ngram needs it: the"
                                         r" draft tokens a step verifies, an integer >= 1 \(e.g. 3\)$"):
        spec_decode(_parse("--speculative-method", "ngram", "--acceptance-rate", "0.5"))


def _sim_run(tmp_path, name: str, *flags: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert main(["sim", "--workload", "chat", "--duration", "30", *flags, "--json", str(out)]) == 0
    return json.loads(out.read_text())["runs"][0]


def test_kvemu_sim_takes_the_flags_and_reports_acceptance(tmp_path):
    spec = _sim_run(tmp_path, "spec", *_drafting("ngram", "2", "--acceptance-rate", "0.6"))
    plain = _sim_run(tmp_path, "plain")
    cluster, sched = spec["speculative"], spec["per_replica"][0]["scheduler"]
    assert cluster["verifies"] == sched["spec_verifies"] > 0
    assert cluster["draft_tokens"] == 2 * cluster["verifies"]
    # tokens a verification keeps beyond the sampled one: 0 to K
    assert 0 <= cluster["mean_accepted_length"] - 1 <= 2
    assert cluster["acceptance_rate"] == cluster["accepted_tokens"] / cluster["draft_tokens"]
    assert "speculative" not in plain and "spec_verifies" not in plain["per_replica"][0]["scheduler"]
    assert spec["tpot_p50_s"] < plain["tpot_p50_s"]
