"""host/tempdirs.py: a process's temporary folders carry its pid, and the next one removes those whose maker was
killed before its cleanup ran (SIGKILL), but never a live process's, nor one younger than MIN_AGE_S."""

import os
import subprocess
import sys
import tempfile

from specmesh.host import tempdirs


def test_folders_of_a_killed_process_are_removed_and_the_others_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    made = subprocess.run([sys.executable, "-c", "import os, signal, tempfile\n"
                           "from specmesh.host import tempdirs\n"
                           "print(tempdirs.made('vboard'), flush=True)\n"
                           "os.kill(os.getpid(), signal.SIGKILL)"],
                          env=dict(os.environ, TMPDIR=str(tmp_path)), capture_output=True, text=True, timeout=60)
    left = tmp_path / made.stdout.strip().rsplit("/", 1)[-1]
    assert made.returncode == -9 and left.is_dir()  # killed: its atexit never ran
    (left / "shim.mpy").write_bytes(b"x")
    young = tmp_path / left.name.replace("vboard", "flash")
    young.mkdir()
    live = tmp_path / ("specmesh-romfs-%d-abc" % os.getppid())
    live.mkdir()
    other = tmp_path / "specmesh-notours"
    other.mkdir()
    old = os.stat(left).st_mtime - 2 * tempdirs.MIN_AGE_S
    for path in (left, live, other):
        os.utime(path, (old, old))
    tempdirs.sweep.cache_clear()
    with tempdirs.folder("flash") as mine:
        assert os.path.basename(mine).startswith("specmesh-flash-%d-" % os.getpid())
        assert not left.exists()  # its maker is gone and it is old: removed
        assert young.is_dir() and live.is_dir() and other.is_dir()  # too young to judge; its maker runs; not ours
    assert not os.path.exists(mine)


def test_a_forked_child_s_exit_leaves_its_parent_s_folders():
    """A child forked by a process with a made() folder (os.fork, a library with a live Mesh) that ends normally
    runs the parent's atexit hooks: it removed the folder, the virtual boards' stand-in modules the parent's next
    VM starts from ('the VM keeps exiting at start'). The parent's own exit still removes it."""
    script = ("import os, sys\n"
              "from specmesh.host import tempdirs\n"
              "out = tempdirs.made('forked')\n"
              "print(out, flush=True)\n"
              "if os.fork() == 0:\n"
              "    sys.exit(0)\n"  # the child ends as a script does: its atexit hooks run
              "os.wait()\n"
              "print(out.is_dir(), flush=True)\n")
    lines = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                           check=True).stdout.split()
    assert lines[1] == "True"
    assert not os.path.exists(lines[0])


# A command's folder() when a second Ctrl-C breaks into its removal as the first one stops the command: the process
# as a command's is (host/quiet.py's handler, then stoppable), its removal's first call sending the second SIGINT
SECOND_CTRL_C_AS_IT_IS_REMOVED = """
import os, shutil, signal, sys
from pathlib import Path
from specmesh.host import stops, tempdirs
from specmesh.host.quiet import exit_quietly

signal.signal(signal.SIGINT, exit_quietly)
rmtree = shutil.rmtree

def rmtree_after_a_ctrl_c(path, *args, **kwargs):
    shutil.rmtree = rmtree
    os.kill(os.getpid(), signal.SIGINT)
    rmtree(path, *args, **kwargs)

def body():
    with tempdirs.folder("boards") as tmp:
        print(tmp, flush=True)
        (Path(tmp) / "board0").mkdir()
        shutil.rmtree = rmtree_after_a_ctrl_c
        raise KeyboardInterrupt

sys.exit(stops.stoppable("specmesh emulate", body))
"""


def test_a_folder_whose_removal_a_second_ctrl_c_broke_into_is_removed_at_exit(tmp_path):
    """A second Ctrl-C as the first stopped the command (`specmesh emulate` removing its boards' temporary folder)
    broke into the folder's removal: TemporaryDirectory had forgotten the folder as its removal began, and the boards'
    flash folders and ROMFS images stayed in the temporary folder for an hour, until a later specmesh swept them. Now
    the process's exit removes it."""
    done = subprocess.run([sys.executable, "-c", SECOND_CTRL_C_AS_IT_IS_REMOVED], capture_output=True, text=True,
                          env=dict(os.environ, TMPDIR=str(tmp_path)), timeout=60)
    assert (done.returncode, done.stderr) == (130, "specmesh emulate: interrupted\n")
    assert done.stdout.strip().startswith(str(tmp_path)) and not os.path.exists(done.stdout.strip())
