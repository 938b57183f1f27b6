"""The package order of docs/architecture.md, checked on the source: every import of every module of dcp/
(module level and the lazy ones inside functions) goes down the order; no package-level import cycle; no file
over 500 lines and no class over 300 lines.

Pure ``ast``: nothing of dcp is imported, so this runs in milliseconds and without torch.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

DCP = Path(__file__).resolve().parents[2] / "dcp"

ORDER = (
    "validate",  # the config checks' message shape, strict file/TOML reading, field type checks (stdlib only)
    "memory",  # the one memory model of an engine's state (parameters, gradients, optimizer)
    "config_advanced",  # the [advanced] section (tuning and diagnostic knobs), a section of DCPConfig
    "config",
    "files",  # atomic writes and output folders (stdlib only): the planner's tables, results, the cache use it
    "dcp",  # the root package: its eager imports are config only; its lazy facade (set_manager) is resolved below
    "argtypes",
    "named_models",
    "data_dists",
    "planner",
    "sim",
    "data",
    "distributed",
    "runtime",
    "models",
    "profiler",
    "loaders",
    "integrations",
    "api",
    "hf_trainer",  # DCPTrainer: transformers.Trainer with DCP's loop (it builds its manager with api.set_manager)
    "experiments",
    "figures",
    "bench",
    "demo",
    "cli",
)
"""Units of dcp/, lowest first (a unit is a subpackage or a top-level module): a module may import its own
unit and any unit before it, never one after it. docs/architecture.md explains each step."""

TORCH_FREE = ORDER[: ORDER.index("data")]
"""Units before ``data`` in ORDER import no torch at all, module level or lazy: the planner is pure (plain data in, plain
data out, no torch.distributed), and the config, the registry of models, the distributions and the simulator
stay importable and testable without torch."""

MAX_FILE_LINES = 500
MAX_CLASS_LINES = 300

KNOWN_VIOLATIONS: frozenset[str] = frozenset({
})
"""Violations present on this branch that other branches of the package split remove ("import A -> B", "size FILE[:Class]",
"missing unit U"); each must still occur (a stale entry fails too), so the list shrinks to empty as they land."""


@dataclass(frozen=True)
class Edge:
    source: str
    """Importing module (dotted)."""
    target: str
    """Imported dcp module (dotted; for ``from pkg import name`` the submodule when ``name`` is one)."""
    line: int
    lazy: bool
    """Inside a function (imported when called) rather than at module level."""
    file: str = ""
    """The importing file, relative to the repository root."""

    @property
    def key(self) -> str:
        return f"import {self.source} -> {self.target}"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(DCP.rglob("*.py")):
        parts = path.relative_to(DCP.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _facade() -> dict[str, str]:
    """Names the root package re-exports lazily (``dcp.set_manager``) -> the module that defines them."""
    tree = ast.parse(MODULES["dcp"].read_text())
    out = {}
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dcp."):
                out.update({a.asname or a.name: node.module for a in node.names})
    return out


FACADE = _facade()


def unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "dcp"


def _lazy_nodes(tree: ast.Module) -> set[int]:
    """ids of the import nodes inside a function or method."""
    out = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            out.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return out


def imports_of(module: str, path: Path) -> list[Edge]:
    """Every dcp import of one module (absolute and relative, module level and lazy)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    lazy = _lazy_nodes(tree)
    rel = path.relative_to(path.parents[len(module.split(".")) - (path.name != "__init__.py")]).as_posix()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    edges = []
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in MODULES:
                    targets.append(sub)
                elif base == "dcp" and a.name in FACADE:
                    targets.append(FACADE[a.name])
                else:
                    targets.append(base)
        for t in targets:
            if t == "dcp" or t.startswith("dcp."):
                edges.append(Edge(module, t, node.lineno, id(node) in lazy, rel))
    return edges


def all_edges() -> list[Edge]:
    return [e for m, p in MODULES.items() for e in imports_of(m, p)]


def upward(edges: list[Edge]) -> list[Edge]:
    rank = {u: i for i, u in enumerate(ORDER)}
    out = []
    for e in edges:
        src, dst = unit(e.source), unit(e.target)
        if e.source == "dcp" and e.lazy and e.target in FACADE.values():
            continue  # the public facade: dcp.set_manager is imported when first used
        if src != dst and rank[dst] > rank[src]:
            out.append(e)
    return out


def _describe(e: Edge) -> str:
    src, dst = unit(e.source), unit(e.target)
    where = "lazy import in a function" if e.lazy else "module-level import"
    return (f"{e.file}:{e.line}: {e.source} imports {e.target} ({where}): "
            f"'{src}' must not import '{dst}', which comes after it in the package order "
            f"({' -> '.join(ORDER)}; docs/architecture.md): move the shared piece down or pass it in")


def test_every_module_belongs_to_a_unit_of_the_order():
    missing = sorted({unit(m) for m in MODULES} - set(ORDER))
    assert not missing, (f"dcp units {missing} are not in ORDER of tests/unit/test_architecture.py: place them in "
                         "the package order (and in docs/architecture.md)")


def test_imports_go_down_the_package_order():
    found = {e.key: e for e in upward(all_edges())}
    bad = [_describe(e) for k, e in sorted(found.items()) if k not in KNOWN_VIOLATIONS]
    assert not bad, "imports up the package order:\n" + "\n".join(bad)
    stale = sorted(k for k in KNOWN_VIOLATIONS if k.startswith("import ") and k not in found)
    assert not stale, f"KNOWN_VIOLATIONS lists imports that no longer occur: {stale}: remove them from the list"


def test_the_planner_and_the_units_before_data_import_no_torch():
    bad = [f"{MODULES[e.source].relative_to(DCP.parent)}:{e.line}: {e.source} imports {e.target}"
           for m, p in MODULES.items() if unit(m) in TORCH_FREE
           for e in _third_party(m, p) if e.target == "torch" or e.target.startswith("torch.")]
    assert not bad, (f"units {TORCH_FREE} must not import torch (the planner is pure: plain data in, plain data "
                     f"out; no torch.distributed): {bad}: move the torch part above 'data' or take plain values")


def _third_party(module: str, path: Path) -> list[Edge]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [Edge(module, a.name, node.lineno, False) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out += [Edge(module, f"{node.module}.{a.name}", node.lineno, False) for a in node.names]
    return out


def package_cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one unit in the unit-level import graph (Tarjan)."""
    graph: dict[str, set[str]] = {u: set() for u in ORDER}
    for e in edges:
        if e.source == "dcp" and e.lazy and e.target in FACADE.values():
            continue
        if unit(e.source) != unit(e.target):
            graph[unit(e.source)].add(unit(e.target))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in ORDER:
        if v not in index:
            visit(v)
    return out


def test_no_package_level_import_cycles():
    known = {e.key for e in all_edges()} & KNOWN_VIOLATIONS
    edges = [e for e in all_edges() if e.key not in known]
    cycles = package_cycles(edges)
    assert not cycles, f"package-level import cycles (each group imports itself through the others): {cycles}"


def sizes() -> dict[str, int]:
    """'size FILE' -> lines for files over MAX_FILE_LINES, 'size FILE:Class' -> lines for classes over
    MAX_CLASS_LINES."""
    out = {}
    for path in MODULES.values():
        rel = path.relative_to(DCP.parent).as_posix()
        text = path.read_text()
        lines = text.count("\n")
        if lines > MAX_FILE_LINES:
            out[f"size {rel}"] = lines
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                out[f"size {rel}:{node.name}"] = node.end_lineno - node.lineno + 1
    return out


def test_no_file_over_500_lines_and_no_class_over_300():
    found = sizes()
    bad = [f"{k[5:]}: {n} lines (limit {MAX_CLASS_LINES if ':' in k else MAX_FILE_LINES}): split it by job"
           for k, n in sorted(found.items()) if k not in KNOWN_VIOLATIONS]
    assert not bad, "too big:\n" + "\n".join(bad)
    stale = sorted(k for k in KNOWN_VIOLATIONS if k.startswith("size ") and k not in found)
    assert not stale, f"KNOWN_VIOLATIONS lists sizes that are now within the limits: {stale}: remove them"


MAX_FUNCTION_LINES = 60
"""A function of the planner or the runtime (docstring included) fits on one screen."""


def long_functions(packages: tuple[str, ...] = ("planner", "runtime")) -> list[str]:
    out = []
    for pkg in packages:
        for path in sorted((DCP / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                n = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and n > MAX_FUNCTION_LINES:
                    out.append(f"{path.relative_to(DCP.parent).as_posix()}:{node.lineno} {node.name}: {n} lines")
    return out


def test_no_function_over_60_lines_in_the_planner_and_the_runtime():
    bad = long_functions()
    assert not bad, f"functions over {MAX_FUNCTION_LINES} lines (split them by step):\n" + "\n".join(bad)


def test_the_function_size_check_sees_a_long_function(tmp_path, monkeypatch):
    (tmp_path / "planner").mkdir()
    (tmp_path / "planner" / "x.py").write_text("def f():\n" + "    x = 1\n" * 61)
    monkeypatch.setattr(sys.modules[__name__], "DCP", tmp_path)
    assert long_functions(("planner",)) == [f"{tmp_path.name}/planner/x.py:1 f: 62 lines"]


# ------------------------------------------------------------------------------------- the checker itself
def _check(tmp_path: Path, files: dict[str, str]) -> list[Edge]:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return [e for rel in files for e in imports_of(rel[:-3].replace("/", ".").removesuffix(".__init__"),
                                                    tmp_path / rel)]


def test_the_walk_sees_lazy_relative_and_from_imports(tmp_path):
    edges = _check(tmp_path, {"dcp/planner/x.py": (
        "import os\nfrom dcp.config import DCPConfig\n"
        "def f():\n    from dcp.runtime import manager\n    from ..profiler import cache\n    import dcp.sim.cluster\n")})
    got = {(e.target, e.lazy) for e in edges}
    assert got == {("dcp.config", False), ("dcp.runtime.manager", True), ("dcp.profiler.cache", True),
                   ("dcp.sim.cluster", True)}
    bad = upward(edges)
    assert {e.target for e in bad} == {"dcp.runtime.manager", "dcp.profiler.cache", "dcp.sim.cluster"}
    msg = _describe(next(e for e in bad if e.target == "dcp.runtime.manager"))
    assert "dcp.planner.x imports dcp.runtime.manager (lazy import in a function)" in msg
    assert "'planner' must not import 'runtime'" in msg


def test_the_root_facade_resolves_to_its_module(tmp_path):
    (edge,) = _check(tmp_path, {"dcp/planner/y.py": "from dcp import set_manager\n"})
    assert edge.target == FACADE["set_manager"] and upward([edge]) == [edge]
    (edge,) = _check(tmp_path, {"dcp/planner/z.py": "from dcp import __version__\n"})
    assert edge.target == "dcp" and upward([edge]) == []


def test_a_cycle_is_found():
    edges = [Edge("dcp.models.t1d", "dcp.runtime.attention", 1, False),
             Edge("dcp.runtime.data", "dcp.models.common", 1, True),
             Edge("dcp.sim.cluster", "dcp.planner.plan", 1, False)]
    assert package_cycles(edges) == [["models", "runtime"]]


def test_order_names_real_units():
    # a unit of the order that no longer exists is a stale line of the order (and of docs/architecture.md)
    present = {unit(m) for m in MODULES}
    missing = [u for u in ORDER if u not in present]
    bad = [u for u in missing if f"missing unit {u}" not in KNOWN_VIOLATIONS]
    assert not bad, f"ORDER names {bad}, not in dcp/: remove them from ORDER and docs/architecture.md"
    stale = [u for u in ORDER if u in present and f"missing unit {u}" in KNOWN_VIOLATIONS]
    assert not stale, f"KNOWN_VIOLATIONS says units {stale} are missing, but they exist: remove those entries"


def test_the_architecture_page_lists_the_same_order():
    import re

    page = (DCP.parent / "docs" / "architecture.md").read_text()
    listed = tuple(re.findall(r"^\| \d+ \| `([a-z_]+)`", page, flags=re.M))
    assert listed == ORDER, f"docs/architecture.md lists {listed}, the test checks {ORDER}: make them one order"


def test_the_torch_check_sees_lazy_and_from_imports(tmp_path):
    path = tmp_path / "x.py"
    path.write_text("def f():\n    import torch.distributed as dist\n    from torch import nn\n    import numpy\n")
    got = [e.target for e in _third_party("dcp.planner.x", path)]
    assert got == ["torch.distributed", "torch.nn", "numpy"]
