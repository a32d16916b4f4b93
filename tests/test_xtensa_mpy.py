"""tools/xtensa_mpy.py: every L32R of the shipped xtensawin module loads the GOT or literal word it was
linked to (the check that would have caught MicroPython v1.28.0's mpy_ld.py adding to llvm-mc's pre-filled
immediates), and the decoder agrees with the object's relocations and llvm-objdump where those exist."""

import re
import shutil
import subprocess

import pytest

from specmesh.tools import native_loops, xtensa_mpy


@pytest.fixture(scope="module")
def shipped():
    return xtensa_mpy.parse(xtensa_mpy.SHIPPED.read_bytes())


def test_the_shipped_module_loads_every_literal_it_was_linked_to(shipped):
    code = xtensa_mpy.check(shipped)
    assert code.l32r and code.called_l32r  # the kernels load constants and call through the GOT
    # zero-overhead loops, bodies aligned (check() fails otherwise): the matmul's five (one per group size),
    # and those of block_shift (inlined in four kernels), attend's q.k, p.v, scaling and expq passes
    assert len(code.loops) >= 5 + 4


def relink(mod, imm16):
    """The module with each L32R's immediate replaced by imm16(offset, target)."""
    code = xtensa_mpy.check(mod)
    text = bytearray(mod.text)
    for off, _, target in code.l32r:
        ins = int.from_bytes(text[off:off + 3], "little")
        text[off:off + 3] = (ins & 0xFF | imm16(off, target) << 8).to_bytes(3, "little")
    return xtensa_mpy.Module(bytes(text), mod.rodata, mod.relocs)


def test_the_unpatched_linker_s_immediates_are_caught(shipped):
    """v1.28.0's mpy_ld.py: imm16 = (0xffff + reloc) >> 2 where llvm-mc pre-filled 0xffff."""
    bad = relink(shipped, lambda off, target: (0xFFFF + target - off) >> 2 & 0xFFFF)
    with pytest.raises(xtensa_mpy.ModuleError, match="L32R load outside the GOT"):
        xtensa_mpy.check(bad)


def test_a_load_one_word_off_is_caught(shipped):
    """Every load one word early stays inside the pool; the calls through the GOT then go wrong."""
    early = relink(shipped, lambda off, target: (target - 4 - ((off + 3) & ~3)) >> 2 & 0xFFFF)
    with pytest.raises(xtensa_mpy.ModuleError):
        xtensa_mpy.check(early)


def test_the_relinked_immediates_are_what_the_module_holds(shipped):
    same = relink(shipped, lambda off, target: (target - ((off + 3) & ~3)) >> 2 & 0xFFFF)
    assert same.text == shipped.text


def test_a_broken_file_is_one_line(tmp_path, capsys):
    path = tmp_path / "x.mpy"
    path.write_bytes(xtensa_mpy.SHIPPED.read_bytes()[:200])
    assert xtensa_mpy.main([str(path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ends early" in err
    assert xtensa_mpy.main([str(tmp_path / "missing.mpy")]) == 2


def test_a_relocation_count_past_the_code_is_one_line_not_memory_exhausted(tmp_path, capsys):
    """A corrupt run length of a relocation appended that many entries: a flipped byte took all the memory (the
    process killed); a run past the text is refused at once."""
    path = tmp_path / "x.mpy"
    # one more relocation before the closing 0xFF: text word 0, a run of 2^35 words (7 bits a byte, high first)
    path.write_bytes(xtensa_mpy.SHIPPED.read_bytes()[:-1] + b"\x03\x00\x81" + b"\x80" * 4 + b"\x00\xff")
    assert xtensa_mpy.main([str(path)]) == 1
    err = capsys.readouterr().err
    assert err == "xtensa_mpy: %s: a relocation points past the end of the module's text\n" % path, err


def test_flags_are_flags_not_a_module_to_read(capsys):
    with pytest.raises(SystemExit) as done:
        xtensa_mpy.main(["--help"])
    assert done.value.code == 0 and "usage: python -m specmesh.tools.xtensa_mpy" in capsys.readouterr().out
    with pytest.raises(SystemExit) as done:
        xtensa_mpy.main(["--verbose"])
    assert done.value.code == 2 and "unrecognized arguments: --verbose" in capsys.readouterr().err


OBJ = native_loops.object_path("xtensawin")
needs_object = pytest.mark.skipif(not OBJ.is_file() or shutil.which("llvm-objdump-22") is None,
                                  reason="run `make native` (llvm-22) to build the object this decoder is checked against")


def _listed(text: str) -> dict[int, str]:
    """llvm-objdump's instructions: address -> its bytes."""
    return {int(m.group(1), 16): m.group(2) for m in re.finditer(r"^\s+([0-9a-f]+):\s+((?:[0-9a-f]{2} )+)", text, re.M)}


@needs_object
def test_the_sweep_finds_exactly_the_object_s_instructions_and_l32r_relocations(shipped):
    """The object's code lies in the module at the sweep's start: the same instruction boundaries as
    llvm-objdump, and an L32R where every R_XTENSA_SLOT0_OP relocation against the literal pool is."""
    code = xtensa_mpy.check(shipped)
    dis = subprocess.run(["llvm-objdump-22", "-d", "-r", "--mcpu=esp32", str(OBJ)], check=True,
                         capture_output=True, text=True).stdout
    text = dis.split("Disassembly of section .text:")[1].split("Disassembly of section")[0]
    # objdump decodes a zero byte of padding (before a function, after a jump) as the first byte of an
    # instruction; the sweep steps over it to the next one
    listed = _listed(text)
    pads = {a - code.start for a in code.pads}
    assert all(listed.get(a, "").startswith("00 ") for a in pads)
    insns = set(listed)
    for a in sorted(pads):  # objdump read on from the padding byte: its boundaries from there to where it is in
        # step again are those of a listing that starts after the byte
        after = _listed(subprocess.run(["llvm-objdump-22", "-d", "--mcpu=esp32", "--start-address=%d" % (a + 1),
                                        "--stop-address=%d" % (a + 64), str(OBJ)], check=True, capture_output=True,
                                       text=True).stdout)
        sync = min((b for b in after if b in listed and b > a), default=a + 64)
        insns = {b for b in insns if not a <= b < sync} | {b for b in after if b < sync}
    relocs = {int(m.group(1), 16) for m in re.finditer(r"^\s+([0-9a-f]+):\s+R_XTENSA_SLOT0_OP\s+\.literal", text, re.M)}
    assert {o - code.start for o in code.insns} == insns
    assert {o - code.start for o, _, _ in code.l32r} == relocs
