"""The layering of docs/architecture.md, read from the code's imports: import statements (function-level ones
included) and `__import__("x")` / `importlib.import_module("x")` calls with a literal name.

- shared/ imports nothing above it, firmware/ only shared/, host/ never firmware/ or tools/;
- inside host/, a room imports only rooms on a lower floor (`HOST_FLOORS`);
- no module imports another that imports it back, directly or through others: the CPython packages
  (host/, shared/, tools/, tests/), the board's modules (firmware/ at the board's root, with shared/), the
  virtual boards' stand-ins (host/emulator/mpy/, at the VM's root) and the bench's board script
  (host/projection/mpy/)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOP = ("shared", "firmware", "host", "tools", "tests")
PACKAGE = "specmesh."  # installed, host/ is specmesh.host, shared/ specmesh.shared, ...
MICROPYTHON_IN_HOST = ("host/emulator/mpy", "host/projection/mpy")  # run at a VM's or board's root, by bare name
# host/'s rooms by floor: a room imports its own modules and rooms of lower floors only
HOST_FLOORS = {
    "layout": 0, "mpycross": 0, "atomic": 0,  # facts and tools every room may use
    "boardclasses": 1,  # the board classes (their drafter's file name from layout)
    "bus": 1,  # links, frames on the wire, fault injection
    "backends": 2, "emulator": 2,  # what a run drives; the virtual boards
    "decode": 3, "provision": 3,  # the decode loop; boards started and flashed
    "projection": 4,  # prices a decoded run on real boards, measures a board
    "cli": 5,  # assembles a run
}


def modules(folder: str, bare: bool = False) -> dict[str, Path]:
    """Module name -> file for the code under `folder`: dotted from the repository root, or (`bare`) by
    file name, as a board or VM imports the files at its root. host/'s MicroPython folders count only by
    their own (`bare`)."""
    base = ROOT / folder
    out = {}
    for f in sorted(base.rglob("*.py")):
        if not bare and "mpy" in f.relative_to(ROOT).parts or "__pycache__" in f.parts:
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
    # the CPython code imports the folders as subpackages of the one installed name (pyproject.toml)
    return {n[len(PACKAGE):] if n.startswith(PACKAGE) else n for n in names}


def top_level(name: str) -> str:
    return name.split(".")[0]


def graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of `mods` it imports (a package importing its own modules by being their
    parent is no edge: only the edges the code writes count)."""
    return {m: {n for n in imported(p, m) if n in mods and n != m} for m, p in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """An import cycle of `edges` as the modules along it (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_each_layer_imports_only_the_layers_below():
    allowed = {"shared": {"shared"}, "host": {"host", "shared"}}
    for layer, ok in allowed.items():
        for name, path in modules(layer).items():
            bad = {n for n in imported(path, name) if top_level(n) in TOP and top_level(n) not in ok}
            assert not bad, "%s imports %s" % (name, sorted(bad))
    # firmware modules import each other by bare name (they sit at a board's root), and shared/
    for name, path in modules("firmware").items():
        bad = {n for n in imported(path, name) if top_level(n) in TOP and top_level(n) != "shared"}
        assert not bad, "%s imports %s" % (name, sorted(bad))


def room(name: str) -> str:
    """host.cli.run -> "cli"; host.layout -> "layout"."""
    return name.split(".")[1] if name.count(".") else ""


def upward_imports(mods: dict[str, Path]) -> list[str]:
    """"a -> b" for each import of a host/ room from a room on the same floor or above."""
    bad = []
    for m, targets in graph(mods).items():
        for n in targets:
            if room(m) and room(n) and room(m) != room(n) and HOST_FLOORS[room(n)] >= HOST_FLOORS[room(m)]:
                bad.append("%s -> %s" % (m, n))
    return sorted(bad)


def test_host_rooms_import_only_lower_floors():
    mods = modules("host")
    assert {room(m) for m in mods} - {""} == set(HOST_FLOORS)  # every room has its floor
    assert upward_imports(mods) == []


@pytest.mark.parametrize("what", ["python", "firmware", *MICROPYTHON_IN_HOST])
def test_no_import_cycle(what):
    if what == "python":
        mods = {k: v for folder in ("host", "shared", "tools", "tests") for k, v in modules(folder).items()}
    elif what == "firmware":
        mods = {**modules("firmware", bare=True), **modules("shared")}
    else:
        mods = modules(what, bare=True)
    assert len(mods) >= 2  # the walk saw the modules
    assert find_cycle(graph(mods)) is None, " -> ".join(find_cycle(graph(mods)))


def test_a_planted_cycle_through_import_calls_is_caught(tmp_path):
    """The checks above see through `__import__` and `importlib.import_module`: a cycle closed by either is
    found, and so is an upward import written as one."""
    files = {"a": "import b\n", "b": "def later():\n    return __import__('c')\n",
             "c": "import importlib\nimportlib.import_module('a')\n"}
    for name, text in files.items():
        (tmp_path / (name + ".py")).write_text(text)
    mods = {name: tmp_path / (name + ".py") for name in files}
    assert find_cycle(graph(mods)) == ["a", "b", "c", "a"]
    (tmp_path / "c.py").write_text("import importlib\n")
    assert find_cycle(graph(mods)) is None
    up = tmp_path / "host" / "bus" / "x.py"
    up.parent.mkdir(parents=True)
    up.write_text("def f():\n    return __import__('host.cli.run')\n")
    assert upward_imports({"host.bus.x": up, "host.cli.run": tmp_path / "c.py"}) == ["host.bus.x -> host.cli.run"]
