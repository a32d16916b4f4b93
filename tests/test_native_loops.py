"""tools/native_loops.py: instructions per MAC of the native matmul's inner loops, counted from the
disassembly of the objects `make native` builds, and the table host/projection/hardware.py keeps. Needs
Debian's riscv64-unknown-elf-objdump and llvm-objdump-22, and the built objects (skipped without them)."""

import shutil

import pytest

from specmesh.host.projection import hardware
from specmesh.tools import native_loops
from specmesh.tools.xtensa_loops import ToolError

missing = [cmd[0] for cmd, _, _ in native_loops.ARCHES.values() if shutil.which(cmd[0]) is None]
pytestmark = [
    pytest.mark.skipif(bool(missing), reason="apt-get install binutils-riscv64-unknown-elf llvm-22 for %s" % missing),
    pytest.mark.skipif(not all(native_loops.object_path(a).is_file() for a in native_loops.ARCHES),
                       reason="run `make native` to build the objects counted here"),
]


def test_hardware_figures_are_the_current_counts():
    counted = native_loops.count()
    assert {a: {g: round(v, 2) for g, v in f.items()} for a, f in counted.items()} == \
        hardware.NATIVE_MATMUL_INSNS_PER_MAC


def test_the_counts_meet_the_issue_targets():
    """<= 6 instructions per MAC on rv32imc for one position, <= 3.5 for five; <= 8 on xtensawin."""
    counted = native_loops.count()
    assert counted["rv32imc"][1] <= 6 and counted["rv32imc"][5] <= 3.5
    assert counted["xtensawin"][1] <= 8
    for figures in counted.values():
        assert figures[5] < figures[1]  # a weight load shared by five positions costs less per MAC


def test_each_group_size_has_its_unrolled_loops():
    """Two per group size: rows of a multiple of four columns, and the others (with a remainder loop)."""
    for arch in native_loops.ARCHES:
        unrolled = sorted(lp.positions for lp in native_loops.inner_loops(arch) if lp.columns == 4)
        assert unrolled == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5], arch


def test_a_loop_is_counted_and_classified_from_its_instructions():
    """Two columns of two positions: 2 byte loads, 4 multiplies; 13 instructions from the branch target to
    the branch, so 13 / 4 per MAC. A loop without multiplies is not matmul's."""
    body = [("lb", "a1, 0(a2)"), ("lb", "a7, 1(a2)"), ("lw", "a3, 0(a4)"), ("mul", "t0, a1, a3"), ("add", "a5, a5, t0"),
            ("lw", "a3, 4(a4)"), ("mul", "t0, a1, a3"), ("add", "a6, a6, t0"), ("mul", "t0, a7, a3"),
            ("mul", "t1, a7, a3"), ("addi", "a2, a2, 2"), ("addi", "a4, a4, 16")]
    code = [(0, "li", "a5, 0")] + [(4 + 4 * i, m, o) for i, (m, o) in enumerate(body)]
    code += [(52, "bne", "a2, a6, 0x4"), (56, "addi", "a0, a0, 1"), (60, "bne", "a0, a1, 0x38"), (64, "ret", "")]
    (lp,) = native_loops.classify(code, "rv32imc")
    assert (lp.lo, lp.insns, lp.columns, lp.positions) == (4, 13, 2, 2) and lp.per_mac == 13 / 4


def test_a_zero_overhead_loop_counts_its_body():
    code = [(0, "loop", "a8, 0x10"), (3, "l8ui", "a9, a2, 0"), (6, "sext", "a9, a9, 7"), (9, "l32i", "a10, a3, 0"),
            (12, "mull", "a9, a9, a10"), (15, "add", "a4, a4, a9"), (16, "retw.n", "")]
    (lp,) = native_loops.classify(code, "xtensawin")
    assert (lp.insns, lp.columns, lp.positions) == (5, 1, 1)


def test_a_missing_disassembler_is_one_line(monkeypatch, capsys):
    monkeypatch.setitem(native_loops.ARCHES, "rv32imc", (["no-such-objdump"], ("lb",), ("mul",)))
    monkeypatch.setitem(native_loops.PACKAGES, "no-such-objdump", "some-package")
    with pytest.raises(ToolError, match="apt-get install some-package"):
        native_loops.disassemble("rv32imc")
    assert native_loops.main([]) == 2
    assert "apt-get install some-package" in capsys.readouterr().err


def test_an_object_the_disassembler_cannot_read_is_one_line(monkeypatch, tmp_path, capsys):
    """A kernels.o cut short (a `make native` stopped mid-write) was objdump's CalledProcessError as a traceback."""
    obj = tmp_path / "kernels.o"
    obj.write_bytes(native_loops.object_path("rv32imc").read_bytes()[:2000])
    monkeypatch.setattr(native_loops, "object_path", lambda arch: obj)
    assert native_loops.main([]) == 2
    assert capsys.readouterr().err == "native_loops: riscv64-unknown-elf-objdump cannot read %s (riscv64-unknown-elf-" \
        "objdump: %s: file format not recognized): run `make native` again\n" % (obj, obj)
