"""tools/xtensa_loops.py: instruction counts of the viper kernels as an ESP32 runs them, and the figures
host/projection/hardware.py derives from them. Needs Debian's binutils-xtensa-lx106 (skipped without it)."""

import shutil

import pytest

from specmesh.host.projection import hardware
from specmesh.tools import xtensa_loops

pytestmark = pytest.mark.skipif(shutil.which(xtensa_loops.OBJDUMP) is None,
                                reason="apt-get install binutils-xtensa-lx106 for the Xtensa disassembler")


@pytest.fixture(scope="module")
def loops():
    return xtensa_loops.count()


def test_every_viper_kernel_is_found_with_its_loops(loops):
    assert list(loops) == xtensa_loops.viper_functions(xtensa_loops.ROOT / "firmware" / "kernels.py")
    assert all(loops[name] for name in loops)  # every kernel loops
    assert len(xtensa_loops.innermost(loops["matmul"])) == 3  # one position, five, two to four
    assert [lp.inner for lp in loops["matmul"]] == [False, False, True, True, True]  # rows, groups, columns


def test_a_loop_counts_its_longest_path_without_its_nested_loops():
    code = [(0, "movi.n", "a2, 0"), (2, "beqz", "a2, 0x8"), (5, "add.n", "a3, a3, a2"), (7, "add.n", "a3, a3, a2"),
            (8, "l32i", "a8, a7, 184"), (11, "excw", ""), (14, "bnez", "a3, 0x5"), (17, "bnez", "a4, 0x0")]
    outer, inner = xtensa_loops.loops(code)
    assert (inner.lo, inner.hi, inner.insns, inner.calls, inner.inner) == (5, 14, 5, 1, True)
    # the outer loop: 0, 2 and 17; the inner loop's instructions are its own
    assert (outer.lo, outer.hi, outer.insns, outer.calls, outer.inner) == (0, 17, 3, 0, False)


def test_hardware_figures_are_the_current_counts(loops):
    assert {n: [lp.insns for lp in ls] for n, ls in loops.items()} == hardware.XTENSA_LOOPS
    calls = {n: [lp.calls for lp in ls] for n, ls in loops.items() if any(lp.calls for lp in ls)}
    assert calls == hardware.XTENSA_LOOP_CALLS
    per_mac = xtensa_loops.matmul_per_mac(loops)
    assert {k: round(v, 1) for k, v in per_mac.items()} == hardware.XTENSA_MATMUL_INSNS_PER_MAC
    assert per_mac[5] < per_mac[4] < per_mac[1]  # a weight load shared by more positions costs less per MAC


def test_a_missing_disassembler_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr(xtensa_loops, "OBJDUMP", "no-such-objdump")
    assert xtensa_loops.main([]) == 2
    assert "apt-get install binutils-xtensa-lx106" in capsys.readouterr().err


@pytest.mark.parametrize("source, says", [
    (b"\x80\x81", "is not Python source ('utf-8' codec can't decode byte 0x80"),
    (b"def f(:\n", "is not Python source (invalid syntax"),
    (b"import micropython\n@micropython.viper\ndef f(x: int) -> int:\n    return x.y\n", "mpy-cross cannot compile"),
    (b"import micropython\n@micropython.viper\ndef matmul(x: int) -> int:\n    return x\n",
     "the kernels' viper matmul has 0 innermost loops, not the firmware's 3"),
])
def test_a_kernels_file_that_is_not_the_firmwares_is_one_line(tmp_path, capsys, source, says):
    """--kernels of a file that is not Python, that mpy-cross refuses, or whose matmul is not the firmware's was a
    traceback (a UnicodeDecodeError, a SyntaxError, a CalledProcessError, a KeyError or an unpacking error)."""
    (tmp_path / "k.py").write_bytes(source)
    assert xtensa_loops.main(["--kernels", str(tmp_path / "k.py")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("xtensa_loops: ") and says in err and err.count("\n") == 1, err
