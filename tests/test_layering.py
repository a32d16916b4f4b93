"""The layering of docs/architecture.md, read from the import statements (function-level ones included):
shared/ imports nothing above it, firmware/ only shared/, host/ never firmware/ or tools/, and no two
host/ modules import each other, directly or through others."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP = ("shared", "firmware", "host", "tools", "tests")


def modules(folder: str) -> dict[str, Path]:
    """Dotted name -> file, for the CPython code under `folder` (the emulator's MicroPython stand-ins excluded)."""
    out = {}
    for f in sorted((ROOT / folder).rglob("*.py")):
        if "mpy" in f.relative_to(ROOT).parts:
            continue
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


def imported(path: Path) -> set[str]:
    """Every absolute module name `path` imports, with `from x import y` also giving x.y (y may be a module)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(node.module + "." + a.name for a in node.names)
    return names


def top_level(name: str) -> str:
    return name.split(".")[0]


def test_each_layer_imports_only_the_layers_below():
    allowed = {"shared": {"shared"}, "host": {"host", "shared"}}
    for layer, ok in allowed.items():
        for name, path in modules(layer).items():
            bad = {n for n in imported(path) if top_level(n) in TOP and top_level(n) not in ok}
            assert not bad, "%s imports %s" % (name, sorted(bad))
    # firmware modules import each other by bare name (they sit at a board's root), and shared/
    for name, path in modules("firmware").items():
        bad = {n for n in imported(path) if top_level(n) in TOP and top_level(n) != "shared"}
        assert not bad, "%s imports %s" % (name, sorted(bad))


def test_no_import_cycle_in_host():
    mods = modules("host")
    edges = {m: {n for n in imported(p) if n in mods and n != m} for m, p in mods.items()}
    # a package imports its own modules by being their parent: only the edges the code writes count
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(n):] + [n]))
            if n not in state:
                visit(n)
        path.pop()
        state[m] = 2

    for m in sorted(mods):
        if m not in state:
            visit(m)
    assert len(state) > 20  # the walk saw host/'s modules
