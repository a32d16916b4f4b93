"""The layering of docs/architecture.md on the board's side, read from the code's imports: import statements
(function-level ones included) and `__import__("x")` / `importlib.import_module("x")` calls with a literal name.

The CPython code's layers, host/'s floors and its cycles are import-linter's contracts (pyproject.toml,
`make lint`). What no import graph of the `specmesh` package sees is checked here: the board's modules import
each other by bare name from a board's root (firmware/ with shared/), and so do the virtual boards' stand-ins
(host/emulator/mpy/, at the VM's root) and the bench's board script (host/projection/mpy/):
- firmware/ imports only itself and shared/; the CPython code never imports firmware/;
- no module there imports another that imports it back, directly or through others."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

from tests.conftest import ROOT

PACKAGE = "specmesh."  # installed, host/ is specmesh.host, shared/ specmesh.shared, ...
MICROPYTHON_IN_HOST = ("host/emulator/mpy", "host/projection/mpy")  # run at a VM's or board's root, by bare name


def modules(folder: str, bare: bool = False) -> dict[str, Path]:
    """Module name -> file for the code under `folder`: dotted from the repository root, or (`bare`) by
    file name, as a board or VM imports the files at its root."""
    base = ROOT / folder
    out = {}
    for f in sorted(base.rglob("*.py")):
        if "__pycache__" in f.parts:
            continue
        parts = list((f.relative_to(base) if bare else f.relative_to(ROOT)).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def _literal_import(node: ast.Call) -> str | None:
    """The module a `__import__("x")` or `importlib.import_module("x")` call names, else None."""
    fn = node.func
    named = (isinstance(fn, ast.Name) and fn.id in ("__import__", "import_module")) or (
        isinstance(fn, ast.Attribute) and fn.attr == "import_module")
    if named and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
        return node.args[0].value
    return None


def imported(path: Path, name: str = "") -> set[str]:
    """Every module name `path` (module `name`, for relative imports) imports, with `from x import y` also
    giving x.y (y may be a module)."""
    names = set()
    package = name.split(".")[:-1] if path.name != "__init__.py" else name.split(".")
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module:
                names.add(module)
            names.update((module + "." if module else "") + a.name for a in node.names)
        elif isinstance(node, ast.Call) and (literal := _literal_import(node)):
            names.add(literal)
    return {n[len(PACKAGE):] if n.startswith(PACKAGE) else n for n in names}


def graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of `mods` it imports (only the edges the code writes count)."""
    return {m: {n for n in imported(p, m) if n in mods and n != m} for m, p in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """An import cycle of `edges` as the modules along it (first == last), or None."""
    try:
        graphlib.TopologicalSorter(edges).prepare()
    except graphlib.CycleError as e:
        return list(reversed(e.args[1]))  # graphlib walks the edges backwards
    return None


def test_firmware_imports_only_itself_and_shared():
    fw = modules("firmware", bare=True)
    for name, path in fw.items():
        bad = {n for n in imported(path, name) if n.split(".")[0] in ("host", "tools", "firmware")}
        assert not bad, "%s imports %s" % (name, sorted(bad))
    for folder in ("host", "shared", "tools"):
        for name, path in modules(folder).items():
            bad = {n for n in imported(path, name) if n.split(".")[0] == "firmware"}
            assert not bad, "%s imports %s" % (name, sorted(bad))


@pytest.mark.parametrize("what", ["firmware", *MICROPYTHON_IN_HOST])
def test_no_import_cycle_on_the_board(what):
    mods = {**modules("firmware", bare=True), **modules("shared")} if what == "firmware" else modules(what, bare=True)
    assert len(mods) >= 2  # the walk saw the modules
    cycle = find_cycle(graph(mods))
    assert cycle is None, " -> ".join(cycle)


def test_a_planted_cycle_through_import_calls_is_caught(tmp_path):
    """The checks above see through `__import__` and `importlib.import_module`: a cycle closed by either is
    found."""
    files = {"a": "import b\n", "b": "def later():\n    return __import__('c')\n",
             "c": "import importlib\nimportlib.import_module('a')\n"}
    for name, text in files.items():
        (tmp_path / (name + ".py")).write_text(text)
    mods = {name: tmp_path / (name + ".py") for name in files}
    cycle = find_cycle(graph(mods))
    assert cycle is not None and cycle[0] == cycle[-1] and sorted(cycle[:-1]) == ["a", "b", "c"]
    (tmp_path / "c.py").write_text("import importlib\n")
    assert find_cycle(graph(mods)) is None
