"""The layout rules of ../shared/DESIGN.md, read from the source (no import runs):

- dependencies point one way: zoo and costmodel import nothing of ours; solvers -> costmodel; env -> costmodel, solvers, zoo; agent -> env, solvers, costmodel, zoo;
  runtime -> costmodel, solvers; shardgym -> all. Nothing in the library imports experiments, and
  nothing but shardgym itself imports shardgym;
- no import cycles among modules (module-level imports);
- project imports at module level. Two exceptions, both visible in the source: a package
  ``__init__``'s lazy ``__getattr__`` export, and an import on a line marked ``# lazy: <why>`` (the
  CLI keeps ``shardgym iopddl`` free of jax this way);
- no module uses another module's underscore names (``from m import _x`` or ``m._x``);
- modules of at most 400 lines, each with a docstring saying what it owns.

``tests/layout_known.txt`` lists the violations still open (issue 14). A new violation fails; so
does a listed one that no longer occurs, so the list only shrinks.
"""
from __future__ import annotations

import ast
import os
import sys
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("zoo", "costmodel", "solvers", "env", "agent", "runtime", "shardgym")
ALLOWED = {
    "zoo": set(),
    "costmodel": set(),
    "solvers": {"costmodel"},
    "env": {"costmodel", "solvers", "zoo"},
    "agent": {"env", "solvers", "costmodel", "zoo"},
    "runtime": {"costmodel", "solvers"},
    "shardgym": set(PACKAGES),
}
MAX_LINES = 400
KNOWN = os.path.join(ROOT, "tests", "layout_known.txt")


def _modules() -> dict[str, str]:
    mods = {}
    for pkg in PACKAGES:
        for dirpath, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                    mods[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return mods


def _target(mod: str, path: str, node: ast.ImportFrom) -> str | None:
    if not node.level:
        return node.module
    parts = mod.split(".") if path.endswith("__init__.py") else mod.split(".")[:-1]
    parts = parts[: len(parts) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def _lazy_getattr_nodes(tree: ast.Module) -> set[int]:
    ids = set()
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef) and fn.name == "__getattr__":
            ids |= {id(n) for n in ast.walk(fn)}
    return ids


def violations() -> set[str]:
    mods = _modules()
    out: set[str] = set()
    graph: dict[str, set[str]] = defaultdict(set)
    for mod, path in sorted(mods.items()):
        src = open(path).read()
        lines = src.splitlines()
        tree = ast.parse(src)
        if len(lines) > MAX_LINES:
            out.add(f"long {mod}")
        if not ast.get_docstring(tree):
            out.add(f"nodoc {mod}")
        top = {id(n) for n in tree.body}
        for n in tree.body:   # imports under a top-level try/if count as module level
            if isinstance(n, (ast.Try, ast.If)):
                top |= {id(x) for x in ast.walk(n) if isinstance(x, (ast.Import, ast.ImportFrom))}
        lazy_ok = _lazy_getattr_nodes(tree) if path.endswith("__init__.py") else set()
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                pairs = [(a.name, None, a.asname or a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _target(mod, path, node)
                pairs = [(base, a.name, a.asname or a.name) for a in node.names]
            else:
                continue
            for base, name, alias in pairs:
                if not base or base.split(".")[0] not in PACKAGES + ("experiments",):
                    continue
                full = f"{base}.{name}" if name and f"{base}.{name}" in mods else base
                if full in mods:
                    aliases[alias] = full
                src_pkg, dst_pkg = mod.split(".")[0], base.split(".")[0]
                if dst_pkg != src_pkg and dst_pkg not in ALLOWED[src_pkg]:
                    out.add(f"dep {mod} -> {full}")
                if name and name.startswith("_") and not name.startswith("__") and full != mod:
                    out.add(f"underscore {mod} uses {base}.{name}")
                if id(node) in top:
                    if full != mod and full in mods:
                        graph[mod].add(full)
                elif id(node) not in lazy_ok and "# lazy:" not in lines[node.lineno - 1]:
                    out.add(f"inner {mod} imports {full}")
        for node in ast.walk(tree):   # m._x on an imported project module
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in aliases and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                out.add(f"underscore {mod} uses {aliases[node.value.id]}.{node.attr}")
    out |= {f"cycle {' '.join(c)}" for c in _cycles(graph)}
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return comps


def _known() -> set[str]:
    if not os.path.exists(KNOWN):
        return set()
    with open(KNOWN) as f:
        return {ln.strip() for ln in f if ln.strip() and not ln.startswith("#")}


def test_no_new_layout_violations():
    new = sorted(violations() - _known())
    assert not new, "layout rules broken (../shared/DESIGN.md; tests/test_layout.py):\n" + "\n".join(new)


def test_known_list_only_shrinks():
    gone = sorted(_known() - violations())
    assert not gone, "fixed; remove from tests/layout_known.txt:\n" + "\n".join(gone)


def test_the_checker_sees_a_planted_violation(tmp_path, monkeypatch):
    """The rules are not vacuous: a solver module that imports the agent, reaches into an
    underscore name and imports inside a function is caught on each count."""
    pkg = tmp_path / "solvers"
    pkg.mkdir()
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "__init__.py").write_text('"""a."""\n')
    (tmp_path / "agent" / "x.py").write_text('"""x."""\nfrom solvers import bad\n_y = 1\n')
    (pkg / "__init__.py").write_text('"""s."""\n')
    (pkg / "bad.py").write_text('"""bad."""\nfrom agent import x\n\n\ndef f():\n    from agent.x import _y\n'
                                '    return x._y, _y\n' + "#\n" * 400)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    found = violations()
    assert "dep solvers.bad -> agent.x" in found
    assert "underscore solvers.bad uses agent.x._y" in found
    assert "inner solvers.bad imports agent.x" in found
    assert "long solvers.bad" in found
    assert "cycle agent.x solvers.bad" in found
