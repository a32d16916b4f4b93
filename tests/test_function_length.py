"""No function in host/ is longer than 80 lines (decorators and docstring included): a longer one does
more than one job, and its jobs get names of their own."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 80


def long_functions(path: Path, limit: int = LIMIT) -> list[str]:
    """"file:line name (N lines)" for each function or method in `path` longer than `limit` lines."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            n = node.end_lineno - first + 1
            if n > limit:
                out.append("%s:%d %s (%d lines)" % (path.name, first, node.name, n))
    return out


def test_no_function_in_host_is_longer_than_80_lines():
    files = sorted((ROOT / "host").rglob("*.py"))
    assert len(files) > 40
    assert [line for f in files for line in long_functions(f)] == []


@pytest.mark.parametrize("body, found", [(78, []), (79, ["m.py:2 f (81 lines)"])])
def test_a_function_is_counted_from_its_decorator_to_its_last_line(tmp_path, body, found):
    src = tmp_path / "m.py"
    src.write_text("\n@staticmethod\ndef f():\n" + "".join("    x%d = %d\n" % (i, i) for i in range(body)))
    assert long_functions(src) == found
