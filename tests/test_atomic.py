"""host/atomic.py: a write that fails or is killed half-way leaves the old file whole and no stray file."""

import os
import signal
import stat
import subprocess
import sys

import pytest

from specmesh.host import atomic
from tests.conftest import ROOT


def test_a_write_that_raises_leaves_the_old_file_and_nothing_else(tmp_path):
    path = tmp_path / "stats.json"
    atomic.write_text(path, "old\n")
    os.chmod(path, 0o640)
    with pytest.raises(RuntimeError), atomic.replacing(path, "w") as f:
        f.write("half of the new")
        raise RuntimeError("interrupted")
    assert path.read_text() == "old\n" and os.listdir(tmp_path) == ["stats.json"]
    atomic.write_bytes(path, b"new")
    assert path.read_bytes() == b"new" and stat.S_IMODE(path.stat().st_mode) == 0o640  # the mode is kept


def test_a_writer_killed_mid_write_leaves_the_old_file(tmp_path):
    path = tmp_path / "big.bin"
    path.write_bytes(b"old")
    code = ("import sys, time\nfrom specmesh.host import atomic\nwith atomic.replacing(sys.argv[1]) as f:\n"
            "    f.write(b'x' * 1000)\n    f.flush()\n    print('writing', flush=True)\n    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], cwd=ROOT, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"writing\n"
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert path.read_bytes() == b"old"
    leftovers = [p.name for p in tmp_path.iterdir() if p != path]
    assert all(n.startswith(".big.bin.") and n.endswith(".part") for n in leftovers)


def test_create_never_overwrites_and_sets_the_mode(tmp_path):
    path = tmp_path / "k"
    atomic.create(path, b"one")
    with pytest.raises(FileExistsError):
        atomic.create(path, b"two")
    assert path.read_bytes() == b"one" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert os.listdir(tmp_path) == ["k"]


def test_unwritable_says_why(tmp_path):
    assert atomic.unwritable(tmp_path / "x.json") is None
    assert atomic.unwritable(tmp_path / "no" / "x.json") == "folder %s does not exist" % (tmp_path / "no")
    assert atomic.unwritable(tmp_path) == "it is a folder"
