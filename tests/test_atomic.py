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


def test_an_output_file_is_written_the_unix_way(tmp_path):
    """A regular file is replaced atomically; a symlink is followed (the link stays); a FIFO is written
    straight to its reader and stays a FIFO; a device is written, never replaced."""
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    atomic.write_output(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"
    dangling = tmp_path / "later.json"
    dangling.symlink_to(tmp_path / "made.json")
    atomic.write_output(dangling, "x")
    assert dangling.is_symlink() and (tmp_path / "made.json").read_text() == "x"

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = subprocess.Popen(["cat", str(fifo)], stdout=subprocess.PIPE)
    assert atomic.output_problem(fifo) is None  # checked without opening it (no reader needed yet)
    atomic.write_output(fifo, "through the pipe\n")
    assert reader.communicate(timeout=10)[0] == b"through the pipe\n"
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)

    with pytest.raises(OSError) as e:
        atomic.write_output("/dev/full", "{}\n")
    assert e.value.errno == 28 and stat.S_ISCHR(os.stat("/dev/full").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "later.json", "link.json", "made.json", "real.json"]


@pytest.mark.parametrize("name", ["-", "/dev/stdout", "/dev/fd/1"])
def test_stdout_is_written_through_its_descriptor_after_what_was_printed(tmp_path, name):
    """`-`, /dev/stdout and /dev/fd/1 with stdout redirected to a file add to it (as a shell does), never
    truncate or replace it."""
    out = tmp_path / "out.txt"
    code = "import sys\nfrom specmesh.host import atomic\nprint('the table')\natomic.write_output(sys.argv[1], '{}\\n')\n"
    with open(out, "w") as f:
        subprocess.run([sys.executable, "-c", code, name], cwd=ROOT, stdout=f, check=True)
    assert out.read_text() == "the table\n{}\n" and stat.S_ISREG(out.stat().st_mode)


def test_output_problem_says_why(tmp_path):
    assert atomic.output_problem("-") is None and atomic.output_problem("/dev/null") is None
    assert atomic.output_problem("") == "an empty name (give a file, or - for stdout)"
    assert atomic.output_problem(tmp_path) == "it is a folder"
    assert atomic.output_problem(tmp_path / "no" / "x") == "folder %s does not exist" % (tmp_path / "no")
    (tmp_path / "f").write_text("")
    for below in ("x.json", "a/x.json"):  # a file where a folder of the path should be
        assert atomic.output_problem(tmp_path / "f" / below) == "%s is a file, not a folder" % (tmp_path / "f")
    fd = next(n for n in range(200, 1024) if not _is_open(n))  # (a fixed 97 was open, read-only, in a CI worker)
    assert atomic.output_problem("/dev/fd/%d" % fd) == "descriptor %d is not open" % fd


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_a_device_or_fifo_is_never_replaced_by_a_file(tmp_path):
    """write_text / write_bytes / replacing name a file to replace: a FIFO (as /dev/full, a device, which root's
    rename would replace) is refused in one line and stays what it is, nothing left beside it."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError) as e:
        atomic.write_bytes(fifo, b"model")
    assert "not a regular file" in str(e.value) and str(fifo) in str(e.value)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.listdir(tmp_path) == ["fifo"]
