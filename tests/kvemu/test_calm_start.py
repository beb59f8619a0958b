"""The README's own commands start without an alarm: the demo, and the replicas of the SGLang step, are
sized so that vLLM would start them (a pool that holds the context limit their requests may reach)."""

from __future__ import annotations

import io
import re
import shlex

from kvemu.cli import parse_args
from kvemu.demo import DEMO_MAX_MODEL_LEN, demo_defaults
from kvemu.replica_cmd import print_limits, settings_from_args
from kvemu.up import validate
from tests.support.kvemu_cli import REPO


def test_the_demo_sizes_its_context_limit_to_its_pool():
    a = parse_args(["demo"])
    demo_defaults(a)
    plan = validate(a)
    assert (a.capacity_blocks, a.max_model_len) == (8192, DEMO_MAX_MODEL_LEN) == (8192, 8192 * 16)
    assert plan.limit_lines == ()
    # a limit the user gives is theirs: it is kept, and warned about where the pool cannot hold it
    a = parse_args(["demo", "--max-model-len", "262144"])
    demo_defaults(a)
    plan = validate(a)
    assert a.max_model_len == 262_144
    assert [line[:40] for line in plan.limit_lines] == ["warning: --max-model-len 262,144 needs 1"]


def test_the_readme_replicas_start_without_a_warning():
    lines = [line.split("#")[0].strip().rstrip("&").strip() for line in (REPO / "README.md").read_text().splitlines()
             if line.startswith("kvemu replica ")]
    assert len(lines) == 2
    for line in lines:
        args = parse_args(shlex.split(line)[1:])
        out = io.StringIO()
        print_limits(settings_from_args(args), out)
        assert out.getvalue() == "", line
    # the same check speaks where a pool is too small for the model's window (what the README had)
    out = io.StringIO()
    print_limits(settings_from_args(parse_args(["replica", "--port", "8101", "--capacity-gib", "8"])), out)
    assert re.match(r"warning: the model's context window \(262,144 tokens\) needs 16,384 KV blocks", out.getvalue())
