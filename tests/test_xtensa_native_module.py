"""The shipped xtensawin module and the viper kernels, executed as Xtensa code on the shipped board (a virtual
ESP32-S3 flashed as `specmesh flash` does, one boot for the module): MicroPython's own loader imports
/native/xtensawin.mpy and firmware/selftest.py passes on it and on kernels.py compiled by
`mpy-cross -march=xtensawin`, and tests/mp_kernel_edges.py finds no shift edge where either differs from
the reference."""

import pytest

from specmesh.tools.bench._qemu import flashed
from tests.conftest import ROOT, require_xtensa

pytestmark = pytest.mark.xtensa


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    """The raw REPL of a flashed virtual ESP32-S3: run(script) -> its console output."""
    require_xtensa()
    with flashed("esp32s3", tmp_path_factory.mktemp("s3")) as transport:

        def run(script: str) -> str:
            out, err = transport.exec_raw(script, timeout=600)
            assert not err, err.decode(errors="replace")
            return out.decode()

        yield run


def test_the_shipped_module_and_viper_pass_the_self_test_on_xtensa(board):
    out = board("import selftest, kernels\nimport native.xtensawin as nat\n"
                "print('names', sorted(type(getattr(nat, k)).__name__ for k in selftest.CHECKS))\n"
                "print('selftest', selftest.run(nat), selftest.run(kernels))")
    assert "names ['function'" in out and "'int'" not in out and "'str'" not in out, out
    assert "selftest None None" in out, out


def test_no_shift_edge_differs_on_xtensa(board):
    out = board((ROOT / "tests" / "mp_kernel_edges.py").read_text())
    assert "viper ok" in out and "native ok" in out, out
