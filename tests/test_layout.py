"""The layout's rules, checked on the source: arrows point down, no cycles, nothing outside the repo.

kvemu (CLI) -> router, replica (processes) and sim (virtual time) -> replica.core and
router.strategies (pure) -> shared; loadgen imports shared only. The command-line front ends
of the processes and the simulator (``FRONT_ENDS``) are CLI too: they, and nothing else below
kvemu, take their flags from ``kvemu.options``, which defines each choice and its flag once and
imports no front end. Imports inside functions
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


@pytest.mark.parametrize("pkg, forbidden", [
    ("loadgen", {"replica", "router", "sim", "kvemu"}),
    ("shared", {"replica", "router", "sim", "kvemu", "loadgen"}),
    ("replica", {"kvemu", "sim", "router", "loadgen"}),
    ("router", {"kvemu", "sim", "replica", "loadgen"}),
    ("sim", {"kvemu"}),
])
def test_arrows_point_down(pkg, forbidden):
    bad = sorted((m, t) for m, ts in GRAPH.items() if top(m) == pkg for t in ts if top(t) in forbidden
                 and not (m in FRONT_ENDS and t.startswith("kvemu.options")))
    assert not bad


FRONT_ENDS = {"replica.cmd", "router.cmd", "sim.sim_cmd", "sim.sweep_cmd"}


def test_the_flag_vocabulary_imports_no_front_end():
    """``kvemu.options`` sits below every command: it may read settings and the core's values,
    never a command (that would be a cycle through the CLI)."""
    bad = sorted((m, t) for m, ts in GRAPH.items() if m.startswith("kvemu.options") for t in ts
                 if t in FRONT_ENDS or (top(t) == "kvemu" and not t.startswith("kvemu.options")))
    assert not bad
    assert all(m in GRAPH for m in FRONT_ENDS)


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
