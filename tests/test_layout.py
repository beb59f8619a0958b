"""The layout's rules, checked on the source: arrows point down, no cycles, nothing outside the repo.

kvemu (CLI) -> router, replica (processes) and sim (virtual time) -> replica.core and
router.strategies (pure) -> shared; loadgen imports shared only. Every command-line front end
lives in kvemu (``kvemu.replica_cmd``, ``kvemu.router_cmd``, ``kvemu.sim_cmd``, ...), and so does
every entry point: the processes start as ``python -m kvemu replica`` / ``python -m kvemu router``, no
package below kvemu has a ``__main__``. The flag vocabulary, ``kvemu.options``,
defines each choice and its flag once and imports only the pure core, shared and itself: no
process, no simulator, no front end. There is no list of exceptions. Imports inside functions
count too (they are still dependencies); ``if TYPE_CHECKING:`` blocks do not.
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("kvemu", "router", "replica", "sim", "loadgen", "shared")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    return skip


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text())
    skip = _type_checking_nodes(tree)
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            # A module's own parent packages are imported before it anyway: not an edge.
            if t and t != name and not name.startswith(t + "."):
                found.add(t)
    return found


GRAPH = {name: imports_of(name, path, modules()) for name, path in modules().items()}


def top(name: str) -> str:
    return name.split(".")[0]


LAYERS_BELOW_CLI = {
    "loadgen": {"replica", "router", "sim", "kvemu"},
    "shared": {"replica", "router", "sim", "kvemu", "loadgen"},
    "replica": {"kvemu", "sim", "router", "loadgen"},
    "router": {"kvemu", "sim", "replica", "loadgen"},
    "sim": {"kvemu"},
}
CORE = ("replica.core", "router.strategies")


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((m, t) for m, ts in graph.items() if top(m) in LAYERS_BELOW_CLI
                  for t in ts if top(t) in LAYERS_BELOW_CLI[top(m)])


def test_arrows_point_down():
    assert upward_imports(GRAPH) == []


def test_an_upward_import_fails_the_layout():
    """The rule is live: a process module importing the vocabulary, or the simulator importing the CLI, is caught."""
    planted = {**GRAPH, "replica.app": GRAPH["replica.app"] | {"kvemu.options.serving"},
               "sim.cells": GRAPH["sim.cells"] | {"kvemu.sim_cmd"}}
    assert upward_imports(planted) == [("replica.app", "kvemu.options.serving"), ("sim.cells", "kvemu.sim_cmd")]


def test_every_front_end_lives_in_the_cli():
    """No module below kvemu builds an argument parser or is an entry point (``python -m PACKAGE``):
    the front ends and the one way to start them, ``python -m kvemu COMMAND``, are all in one home."""
    bad = [name for name, path in modules().items() if top(name) != "kvemu" and "argparse" in external_imports(path)]
    assert bad == []
    assert sorted(name for name in GRAPH if name.endswith(".__main__")) == ["kvemu.__main__"]


def test_the_flag_vocabulary_imports_only_the_core_and_shared():
    """``kvemu.options`` sits below every command and beside the core: it may read the core's values and
    shared settings, never a process, the simulator or a command (that would run arrows back up)."""
    bad = sorted((m, t) for m, ts in GRAPH.items() if m.startswith("kvemu.options") for t in ts
                 if not (t.startswith("kvemu.options") or top(t) == "shared"
                         or any(t == c or t.startswith(c + ".") for c in CORE)))
    assert bad == []


def external_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize("pure", ["replica.core", "router.strategies"])
def test_the_cache_core_and_the_strategies_are_pure(pure):
    for name, targets in GRAPH.items():
        if name == pure or name.startswith(pure + "."):
            outside = {t for t in targets if top(t) in ("replica", "router") and not t.startswith(pure)}
            assert not outside, (name, outside)
            io = external_imports(modules()[name]) & {"aiohttp", "asyncio", "socket", "redis", "urllib"}
            assert not io, (name, io)


def test_no_import_cycles():
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in GRAPH.get(node, ()):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join(stack[stack.index(nxt):] + [node, nxt]))
            if nxt not in state:
                visit(nxt, stack + [node])
        state[node] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [])


def test_nothing_refers_to_a_folder_beside_the_repository():
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    hits = []
    for f in files:
        path = REPO / f
        if path.suffix in (".gz", ".png", ".js") or not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        if "../shared" in text:
            hits.append(f)
    assert hits == [] or hits == ["tests/test_layout.py"]


MAX_FUNCTION_LINES = 60


def test_no_production_function_is_longer_than_60_lines():
    """The founders' rule (functions under ~60 lines), over every package's functions and methods,
    nested ones too: a function's lines from its ``def`` to its last, docstring and comments in."""
    long = []
    for name, path in sorted(modules().items()):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}:{node.lineno} {node.name} ({lines} lines)")
    assert long == [], "split where a reader would: " + "; ".join(long)
