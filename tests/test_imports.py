"""The import graphs of ``torch_replay`` and ``inductor_pass``: no cycle, no module using
another's private names (``torch_replay``: none from another room, see PRIVATE_RULES), and
every module imports on its own.

The graph is read from the source (``ast``): every ``import`` statement of a module,
at any depth, so the lazy imports inside functions count as edges too (a lazy import
hides a circle from the interpreter, not from the reader). Importing ``P.Q`` from a
module outside subpackage ``P`` also runs ``P/__init__.py``: that is an edge to ``P``
as well. The root package itself is not such an edge (every module runs it first).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from .installed import subprocess_env

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("torch_replay", "inductor_pass", "benchmarks")

# Cycles that live in files another change owns, each with what removes it. Listed
# cycles are tolerated, not required: delete an entry once its cycle is gone.
KNOWN_CYCLES: set[frozenset] = set()
# Private names used across modules in files another change owns (same rule as above).
KNOWN_PRIVATE_USES: set[str] = set()


def _modules(package: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package) for every ``.py`` under ``package``."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_pkg)
    return out


def _absolute(node: ast.ImportFrom, name: str, is_pkg: bool) -> str:
    """The module ``from ... import`` names, relative levels resolved against ``name``."""
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_pkg else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (anywhere in its source)."""
    mods = _modules(package)
    root = package.name
    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in mods.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                target = _absolute(node, name, is_pkg)
                for a in node.names:  # `from P import Q` imports module P.Q when Q is one
                    sub = f"{target}.{a.name}"
                    targets.add(sub if sub in mods else target)
        edges = set()
        for t in targets:
            parts = t.split(".")
            if parts[0] != root:
                continue
            # t and the subpackages above it that `name` is not inside of.
            for k in range(2, len(parts) + 1):
                above = ".".join(parts[:k])
                if above in mods and not (name + ".").startswith(above + "."):
                    edges.add(above)
            if t == root:
                edges.add(root)
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
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
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "pkg"


def test_finder_sees_a_lazy_circle_and_a_subpackage_init(tmp_path):
    # pkg.a -> pkg.sub.b (and so pkg.sub) ; pkg.sub/__init__ -> pkg.sub.c -> (lazily) pkg.a
    pkg = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from .sub.b import x\n",
            "pkg/sub/__init__.py": "from .c import y\n",
            "pkg/sub/b.py": "x = 1\n",
            "pkg/sub/c.py": "def y():\n    from ..a import x\n    return x\n",
            "pkg/d.py": "from . import a\n",
        },
    )
    graph = import_graph(pkg)
    assert graph["pkg.a"] == {"pkg.sub", "pkg.sub.b"}
    assert graph["pkg.sub.c"] == {"pkg.a"}
    assert graph["pkg.d"] == {"pkg.a"}
    assert find_cycles(graph) == [["pkg.a", "pkg.sub", "pkg.sub.c"]]
    # The same package without the lazy import has none.
    (pkg / "sub" / "c.py").write_text("def y():\n    return 1\n")
    assert find_cycles(import_graph(pkg)) == []


def private_uses(package: Path, rooms: bool = False) -> list[str]:
    """``module: name`` for each private name a module takes from another module of ``package``.

    A private name is one with a leading underscore (dunders excepted): ``from M import _x``,
    and ``M._x`` where ``M`` is a module of the package bound by an import, with relative
    imports resolved. ``rooms``: a private name may still be shared inside a room, which is a
    folder (its modules and its ``__init__``; the package's own folder is one too), never
    across two.
    """
    mods = _modules(package)
    out = []

    def private(attr: str) -> bool:
        return attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__"))

    def room(module: str) -> str:
        return module if mods[module][1] else module.rpartition(".")[0]

    def shared(user: str, source: str) -> bool:
        return rooms and room(user) == room(source)

    for name, (path, is_pkg) in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        aliases: dict[str, str] = {}  # local name -> module of the package
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(node, name, is_pkg)
                for a in node.names:
                    sub = f"{source}.{a.name}"
                    if sub in mods:
                        aliases[a.asname or a.name] = sub
                    elif (
                        source in mods
                        and source != name
                        and private(a.name)
                        and not shared(name, source)
                    ):
                        out.append(f"{name}: from {source} import {a.name}")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name in mods and a.asname:
                        aliases[a.asname] = a.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and aliases[node.value.id] != name
                and private(node.attr)
                and not shared(name, aliases[node.value.id])
            ):
                out.append(f"{name}: {aliases[node.value.id]}.{node.attr}")
    return sorted(set(out))


def test_private_use_finder_sees_both_forms(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "_x = 1\ny = 2\n",
            "pkg/b.py": "from pkg.a import _x, y\n",
            "pkg/c.py": "def f():\n    from pkg import a\n    return a._x + a.y\n",
            "pkg/d.py": "from pkg.a import y\nfrom pkg import a\nz = a.y + a.__name__\n",
            "pkg/e.py": "from .a import _x\nfrom . import a\nw = a._x\n",
        },
    )
    assert private_uses(pkg) == [
        "pkg.b: from pkg.a import _x",
        "pkg.c: pkg.a._x",
        "pkg.e: from pkg.a import _x",
        "pkg.e: pkg.a._x",
    ]


def test_private_use_finder_rooms(tmp_path):
    pkg = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/_inner.py": "_x = 1\n",
            "pkg/pub.py": "_y = 1\n",
            "pkg/top.py": "from ._inner import _x\nfrom .pub import _y\nfrom .room.a import _z\n",
            "pkg/room/__init__.py": "from .a import _z\n",
            "pkg/room/a.py": "_z = 1\n",
            "pkg/room/b.py": "from .a import _z\nfrom ..pub import _y\n",
        },
    )
    assert private_uses(pkg, rooms=True) == [
        "pkg.room.b: from pkg.pub import _y",
        "pkg.top: from pkg.room.a import _z",
    ]
    assert len(private_uses(pkg)) == 6


# The compiler plugin's rule is strict (no module takes another's private names); in the
# checkpoint package a room is a folder (_replay/, _planning/, audit/, calibrate/, verify/,
# integrations/ and the package's own): underscore names are shared inside one, never
# across two (what one room takes from another carries no underscore).
PRIVATE_RULES = {"torch_replay": True, "inductor_pass": False, "benchmarks": False}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package):
    cycles = find_cycles(import_graph(ROOT / package))
    unexpected = [c for c in cycles if frozenset(c) not in KNOWN_CYCLES]
    assert not unexpected, (
        f"import cycles in {package} (each list is one strongly connected set of modules; "
        "move what both sides need into a module both may import): " + repr(unexpected)
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_uses_another_modules_private_names(package):
    uses = [
        u
        for u in private_uses(ROOT / package, rooms=PRIVATE_RULES[package])
        if u not in KNOWN_PRIVATE_USES
    ]
    assert not uses, f"private names used across modules of {package}: {uses}"


# Modules that exist to adapt one library and import it at the top: imported only where
# that library is (torchtitan lives in .venv/torchtitan-site, which only the spawned
# workers of tests/test_torchtitan.py put on the path; they import this module there).
NEEDS = {"torch_replay.integrations.torchtitan": "torchtitan"}


@pytest.mark.parametrize("package", PACKAGES)
def test_every_module_imports_on_its_own(package):
    # One fresh interpreter; before each module every module of the package is dropped from
    # sys.modules, so each import starts from nothing of the package (torch stays loaded).
    names = [n for n in _modules(ROOT / package) if not n.endswith("__main__")]  # a CLI
    script = textwrap.dedent(
        """
        import importlib, importlib.util, json, sys, traceback
        package, needs = sys.argv[1], json.loads(sys.argv[2])
        failed = []
        for name in sys.argv[3:]:
            if name in needs and importlib.util.find_spec(needs[name]) is None:
                continue
            for m in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
                if m != "torch_replay._C":
                    del sys.modules[m]
            try:
                importlib.import_module(name)
            except Exception:
                failed.append(name + ": " + traceback.format_exc().splitlines()[-1])
        print("\\n".join(failed))
        sys.exit(1 if failed else 0)
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", script, package, json.dumps(NEEDS), *names],
        cwd=tempfile.gettempdir(),  # not the checkout: the tested package is imported
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=900,  # a hang guard, not a time box (a loaded 2-core CI machine)
    )
    assert r.returncode == 0, r.stdout + r.stderr
