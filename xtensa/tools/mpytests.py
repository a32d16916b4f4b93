"""MicroPython's own test suite (its tests/run-tests.py) on the virtual Xtensa board: `make xtensa-mpy-tests`.

Starts one virtual ESP32-S3 under QEMU (host/emulator/qemu.py) and runs run-tests.py against its pty (`-t port:PTY`:
each test in the raw REPL after a soft reset), over the vendored test folders (vendor/README.md), with the tests
xtensa/mpytests-exclude.txt lists (each with its reason) left out. Exit status: run-tests.py's.
Usage: python xtensa/tools/mpytests.py MPY_SRC [TEST_DIR ... | TEST_FILE.py ...] (default: DIRS)
"""

import subprocess
import sys
import tempfile
from pathlib import Path

from specmesh.host.emulator import BoardError, make_board

HERE = Path(__file__).resolve().parent.parent
DIRS = ("basics", "float", "micropython", "misc", "import", "extmod", "inlineasm/xtensa")


def excluded() -> list[str]:
    """The regexes of xtensa/mpytests-exclude.txt (a test per line, then its reason after '#')."""
    out = []
    for line in (HERE / "mpytests-exclude.txt").read_text().splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            out.append(name)
    return out


def main(src: str, dirs: list[str]) -> int:
    tests = Path(src).resolve() / "tests"
    with tempfile.TemporaryDirectory(prefix="specmesh-mpytests-") as tmp:
        try:  # no QEMU, a firmware that does not boot: one line, not a traceback
            board = make_board(Path(tmp) / "board", "esp32s3", qemu=True, name="mpytests").start()
        except BoardError as e:
            print("mpytests: %s" % e, file=sys.stderr)
            return 1
        try:
            files = [d for d in dirs if d.endswith(".py")]
            cmd = [sys.executable, "run-tests.py", "-t", "port:" + board.port,
                   *(files or ["-d", *(dirs or DIRS)])]
            for name in excluded():
                cmd += ["-e", name]
            return subprocess.run(cmd, cwd=tests).returncode
        finally:
            board.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
