"""tools/xtensa_loops.py: instruction counts of the viper kernels as an ESP32 runs them, and the figures
host/hardware.py derives from them. Needs Debian's binutils-xtensa-lx106 (skipped without it)."""

import shutil

import pytest

from host import hardware
from tools import xtensa_loops

pytestmark = pytest.mark.skipif(shutil.which(xtensa_loops.OBJDUMP) is None,
                                reason="apt-get install binutils-xtensa-lx106 for the Xtensa disassembler")


@pytest.fixture(scope="module")
def loops():
    return xtensa_loops.count()


def test_every_viper_kernel_is_found_with_its_loops(loops):
    assert list(loops) == xtensa_loops.viper_functions(xtensa_loops.ROOT / "firmware" / "kernels.py")
    assert all(loops[name] for name in loops)  # every kernel loops
    assert len(loops["matmul"]) == 3  # one position, five, two to four


def test_hardware_figures_are_the_current_counts(loops):
    per_mac = xtensa_loops.matmul_per_mac(loops)
    assert {k: round(v, 1) for k, v in per_mac.items()} == hardware.XTENSA_MATMUL_INSNS_PER_MAC
    assert per_mac[5] < per_mac[4] < per_mac[1]  # a weight load shared by more positions costs less per MAC


def test_a_missing_disassembler_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(xtensa_loops, "OBJDUMP", "no-such-objdump")
    assert xtensa_loops.main([]) == 2
    assert "apt-get install binutils-xtensa-lx106" in capsys.readouterr().err
