"""The package's layering, read from its source: every import, at module level or inside a function.

Layers, lowest first (docs/architecture.md): the foundation modules, then
``runs`` (the data contract), ``core`` (the instrument), ``analysis``,
``report``, and the applications ``loader``, ``pipeline`` and ``sweep``; the
command line and the activation hook on top. A module may import its own layer
or one below; nothing imports the CLI; no two modules import each other, even
through others.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import stagebench

ROOT = Path(stagebench.__file__).resolve().parent

FOUNDATION = {"_errors", "_memory", "_numbers", "_version", "_import_hook", "_spdl_private", "_settings", "_signals"}
LAYERS = ["model", "runs", "core", "analysis", "report", "job", "loader", "pipeline", "sweep"]
TOP = {"__init__", "__main__", "_cli", "_activate", "_hydra_app"}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    # examples/ holds a user's script, conf/ (in an installed package) Hydra's configs: not stagebench's code
    return {_module_name(p): p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] not in ("examples", "conf")}


def _imports(path: Path, known: set[str]) -> set[str]:
    """stagebench modules that ``path`` imports, anywhere in the file."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import; stagebench imports absolutely"
            base = node.module or ""
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out.update(n for n in names if n in known)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {m: _imports(p, known) - {m} for m, p in mods.items()}


def _rank(module: str) -> int:
    parts = module.split(".")
    if module == "stagebench":
        return len(LAYERS) + 1
    if len(parts) == 2:
        name = parts[1]
        if name in FOUNDATION:
            return -1
        if name in TOP:
            return len(LAYERS) + 1
        if name in LAYERS:  # a sub-package's (empty) __init__
            return LAYERS.index(name)
        raise AssertionError(f"{module}: a top-level module in no layer; add it to docs/architecture.md and here")
    return LAYERS.index(parts[1])


def test_every_module_belongs_to_a_layer():
    for m in _modules():
        _rank(m)


def test_imports_point_down_the_layers_only():
    upward = []
    for m, deps in _graph().items():
        for d in deps:
            if d == "stagebench" and m != "stagebench":
                upward.append(f"{m} -> stagebench (the public API is for users; import the module itself)")
            elif _rank(d) > _rank(m):
                upward.append(f"{m} -> {d}")
    assert not upward, "imports against the layering:\n" + "\n".join(sorted(upward))


def test_nothing_imports_the_cli():
    users = [m for m, deps in _graph().items() if "stagebench._cli" in deps and m != "stagebench.__main__"]
    assert not users


def test_no_import_cycle():
    graph = _graph()
    # Tarjan's strongly connected components: any component of two or more modules is a cycle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_sub_package_inits_are_empty():
    # `import stagebench.core._stats` must not pay for its siblings: start-up cost matters.
    for name in LAYERS:
        assert (ROOT / name / "__init__.py").read_text(encoding="utf-8").strip() == ""


def _private_uses(prefix: str) -> dict[str, list[str]]:
    """Files that import a private module or name of ``prefix`` (a ``_name`` segment), or name one in a string."""
    uses: dict[str, list[str]] = defaultdict(list)
    for path in _modules().values():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names = [node.value] if node.value.startswith(prefix + ".") and " " not in node.value else []
            for n in names:
                parts = n.split(".")
                if parts[0] == prefix and any(p.startswith("_") for p in parts[1:]):
                    uses[str(path.relative_to(ROOT))].append(n)
    return dict(uses)


def test_spdl_private_names_are_imported_in_one_adapter():
    assert set(_private_uses("spdl")) == {"_spdl_private.py"}


def test_hydra_internals_are_used_in_one_adapter():
    assert set(_private_uses("hydra")) == {"sweep/_hydra_internal.py"}


def test_the_public_api_resolves():
    for name in stagebench.__all__:
        assert getattr(stagebench, name) is not None


def test_activation_at_interpreter_start_loads_no_heavy_standard_module():
    """With SPDL_PIPELINE_DIAGNOSTIC_MODE set, every interpreter start (every worker process too) runs
    the activation hook: it must not load typing, threading, pathlib and the like (milliseconds each;
    an upward import once made it 22 ms instead of 10)."""
    import os
    import subprocess
    import sys

    heavy = ("typing", "threading", "pathlib", "contextlib", "dataclasses", "traceback", "inspect")
    code = (
        f"import sys; print(','.join(m for m in {heavy!r} if m in sys.modules)); "
        "print('stagebench.pipeline._spdl_hook' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "SPDL_PIPELINE_DIAGNOSTIC_MODE"}
    on = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "SPDL_PIPELINE_DIAGNOSTIC_MODE": "1"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert on[1] == "True", "the .pth did not install the hook: nothing was checked"
    assert set(on[0].split(",")) - set(off.split("\n")[0].split(",")) <= {""}, on[0]
