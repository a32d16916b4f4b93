"""Reads a linked xtensawin native module (.mpy) and checks that every L32R in its code loads the literal
it was linked to, with no disassembler and no board.

    python -m specmesh.tools.xtensa_mpy [firmware/native/xtensawin.mpy]

mpy_ld.py lays an xtensawin module's text out as a 3-byte jump to `mpy_init`, the GOT (words the loader
relocates: mp_fun_table, the qstr table, function pointers, the function objects in rodata), the literal
pool (LIT: constants) and then the code, which reaches both pools by PC-relative L32R. MicroPython
v1.28.0's mpy_ld.py *added* the pool offset to the L32R immediate already in the instruction, which gas
leaves 0 but llvm-mc-22 pre-fills (0xffff): every such load then read a word far from its literal, and the
shipped module's `matmul` came back as an int on every ESP32 (vendor/patches/ fixes it). This module finds
the instructions by a linear sweep of the code (an Xtensa instruction's length follows from its first
nibble; llvm-mc pads with nop, nop.n or one zero byte, before an `entry` or after a jump), checks the
sweep against every function start the module names (the jump, the GOT's and rodata's code pointers,
each call8 target), then checks every L32R: its word lies in the GOT or LIT, every pool word is loaded by
some L32R (mpy_ld.py makes entries only for literals the code loads), a register loaded by L32R and
then called (callx8) holds a GOT word that the loader points at a function start, and no zero-overhead
loop's first instruction crosses a 4-byte fetch boundary (an ISA requirement llvm-mc does not enforce).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

from specmesh.host.cli.flags import a_path
from specmesh.tools import run_tool

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "firmware" / "native" / "xtensawin.mpy"
MPY_ARCH_FLAGS = 0x40
SCOPE_RODATA, SCOPE_BSS = 0x20, 0x40
KIND_TEXT = 0  # a relocation whose destination is the module's text (py/persistentcode.c: mp_native_relocate)


class ModuleError(Exception):
    """A module that is not a well-formed xtensawin natmod, or whose L32Rs do not load their literals."""


@dataclass
class Module:
    """An xtensawin natmod's text and rodata, and its relocations as (in_rodata, word index, kind)."""

    text: bytes
    rodata: bytes
    relocs: list[tuple[bool, int, int]]


@dataclass
class Code:
    """The module's code as swept: instruction offsets, call8 targets, and the L32Rs as (offset,
    register, target)."""

    start: int
    insns: list[int] = field(default_factory=list)
    call_targets: set[int] = field(default_factory=set)
    l32r: list[tuple[int, int, int]] = field(default_factory=list)
    called_l32r: list[tuple[int, int]] = field(default_factory=list)  # (callx8 offset, L32R target)
    pads: list[int] = field(default_factory=list)  # single padding bytes stepped over
    loops: list[int] = field(default_factory=list)  # offsets of zero-overhead loop instructions


def parse(data: bytes) -> Module:
    """The text, rodata and relocations of a native .mpy (the layout py/persistentcode.c loads)."""
    pos = 4

    def byte() -> int:
        nonlocal pos
        if pos >= len(data):
            raise ModuleError("the module ends early")
        pos += 1
        return data[pos - 1]

    def uint() -> int:
        v = 0
        while True:
            b = byte()
            v = v << 7 | b & 0x7F
            if not b & 0x80:
                return v

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise ModuleError("the module ends early")
        pos += n
        return data[pos - n:pos]

    if data[:1] != b"M" or len(data) < 4:
        raise ModuleError("not a .mpy file")
    if data[2] & MPY_ARCH_FLAGS:
        uint()
    n_qstr, n_obj = uint(), uint()
    if n_obj:
        raise ModuleError("a native module has no object table")
    for _ in range(n_qstr):
        q = uint()
        if not q & 1:
            take((q >> 1) + 1)
    kind_len = uint()
    text = take(kind_len >> 3)
    scope = uint()
    ro_len = uint() if scope & SCOPE_RODATA else 0
    if scope & SCOPE_BSS:
        uint()
    rodata = take(ro_len)
    relocs, where = [], (False, 0)
    while (op := byte()) != 0xFF:
        if op & 1:
            a = uint()
            where = (bool(a & 1), a >> 1)
        op >>= 1
        n = 1
        if op <= 5:
            if op & 1:
                n = uint()
            op >>= 1
        if where[1] + n > len(rodata if where[0] else text) // 4:  # a corrupt count: never n entries appended
            raise ModuleError("a relocation points past the end of the module's %s" % ("rodata" if where[0] else "text"))
        for _ in range(n):
            relocs.append((where[0], where[1], op))
            where = (where[0], where[1] + 1)
    return Module(text, rodata, relocs)


def word(buf: bytes, off: int) -> int:
    return int.from_bytes(buf[off:off + 4], "little")


def length(b0: int) -> int:
    """An instruction's length from its first byte: op0 8..13 are the density option's 16-bit forms."""
    return 2 if 8 <= (b0 & 0xF) <= 13 else 3


def is_entry(text: bytes, off: int) -> bool:
    return off + 3 <= len(text) and text[off] == 0x36 and text[off + 1] & 0xF == 1  # entry a1, N


def sweep(text: bytes, start: int) -> Code:
    """Decode from `start` to the end of text: instruction offsets, call8 targets, L32Rs, and callx8s of a
    register whose last write in the function was an L32R."""
    code, off, loaded, jump_to = Code(start), start, {}, -1
    while off < len(text):
        if text[off] == 0 and off % 4 == 3 and (jump_to == off + 1 or is_entry(text, off + 1)):
            code.pads.append(off)  # one byte of padding before a function, or that a jump steps over
            off += 1
            continue
        if is_entry(text, off):
            loaded = {}
        n = length(text[off])
        if off + n > len(text):
            raise ModuleError("an instruction runs past the end of the code at 0x%x" % off)
        ins = int.from_bytes(text[off:off + n], "little")
        code.insns.append(off)
        op0, t = ins & 0xF, ins >> 4 & 0xF
        jump_to = -1
        if n == 3 and op0 == 6 and t & 3 == 0:  # J: an 18-bit signed offset from the next word
            offset = ins >> 6
            jump_to = off + 4 + offset - ((offset & 1 << 17) << 1)
        if n == 3 and op0 == 1:  # L32R at, label
            target = ((off + 3) & ~3) + (((ins >> 8) - 0x10000) << 2)
            code.l32r.append((off, t, target))
            loaded[t] = target
        elif n == 3 and op0 == 5 and t & 3 == 2:  # CALL8
            offset = ins >> 6
            offset -= (offset & 1 << 17) << 1
            code.call_targets.add((off & ~3) + (offset << 2) + 4)
            loaded = {}
        elif n == 3 and ins & 0xFF == 0x76 and ins >> 12 & 0xF in (8, 9, 10):  # LOOP, LOOPNEZ, LOOPGTZ
            code.loops.append(off)
            loaded.pop(t, None)
        elif n == 3 and ins & 0xFFF0FF == 0x0000E0:  # CALLX8 as
            s = ins >> 8 & 0xF
            if s in loaded:
                code.called_l32r.append((off, loaded[s]))
            loaded = {}
        elif n == 3:
            loaded.pop(t, None)  # most 24-bit forms write t, r or nothing: forget t conservatively
            loaded.pop(ins >> 12 & 0xF, None)
        else:
            loaded.pop(t, None)
            loaded.pop(ins >> 12 & 0xF, None)
        off += n
    return code


def check(mod: Module) -> Code:
    """Sweep the module's code and check its L32Rs; raises ModuleError saying what is wrong."""
    text = mod.text
    if len(text) < 8 or text[0] & 0x3F != 6:
        raise ModuleError("the text does not start with mpy_ld.py's jump to mpy_init")
    entry = (int.from_bytes(text[:3], "little") >> 6) + 4
    text_words = {i for ro, i, k in mod.relocs if not ro}
    got_end = 1
    while got_end in text_words:
        got_end += 1
    if got_end == 1:
        raise ModuleError("no GOT after the jump")
    got = {i: k for ro, i, k in mod.relocs if not ro and i < got_end}
    code_ptrs = {word(text, 4 * i) for i, k in got.items() if k == KIND_TEXT}
    code_ptrs |= {word(mod.rodata, 4 * i) for ro, i, k in mod.relocs if ro and k == KIND_TEXT}
    known = code_ptrs | {entry}
    found = None
    for start in range(4 * got_end, min(known) + 1, 4):
        if not is_entry(text, start):
            continue
        code = sweep(text, start)
        if known <= set(code.insns):
            found = code
            break
    if found is None:
        raise ModuleError("no sweep of the code meets every function start the module names")
    code = found
    boundaries = set(code.insns)
    lost = sorted(t for t in code.call_targets if t not in boundaries or not is_entry(text, t))
    if lost:
        raise ModuleError("call8 to 0x%x, which is not a function start" % lost[0])
    pool = range(4, code.start)
    bad = [(o, t) for o, _, t in code.l32r if t not in pool]
    if bad:
        o, t = bad[0]
        raise ModuleError("%d of %d L32R load outside the GOT and literal pool (0x%x..0x%x); the first, at 0x%x, "
                          "loads 0x%x" % (len(bad), len(code.l32r), 4, code.start, o, t))
    unused = sorted(set(pool[::4]) - {t for _, _, t in code.l32r})
    if unused:
        raise ModuleError("pool word at 0x%x is loaded by no L32R" % unused[0])
    for o in code.loops:  # the ISA: a loop body's first instruction must not cross a fetch boundary
        body = o + 3
        if body % 4 + length(text[body]) > 4:
            raise ModuleError("the zero-overhead loop at 0x%x starts its body across a 4-byte boundary" % o)
    for o, t in code.called_l32r:
        i = t // 4
        if got.get(i) != KIND_TEXT or word(text, t) not in boundaries or not is_entry(text, word(text, t)):
            raise ModuleError("callx8 at 0x%x calls the word at 0x%x, not a GOT pointer to a function" % (o, t))
    return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specmesh.tools.xtensa_mpy", description=__doc__.split("\n\n")[0])
    ap.add_argument("module", type=a_path, nargs="?", default=SHIPPED,
                    help="a linked xtensawin .mpy (default: the shipped firmware/native/xtensawin.mpy)")
    path = ap.parse_args(argv).module
    try:
        code = check(parse(path.read_bytes()))
    except OSError as e:
        print("xtensa_mpy: cannot read %s: %s" % (path, e.strerror), file=sys.stderr)
        return 2
    except ModuleError as e:
        print("xtensa_mpy: %s: %s" % (path, e), file=sys.stderr)
        return 1
    print("%s: %d instructions, %d L32R, each loading its GOT or literal word (pool 0x4..0x%x); %d callx8 "
          "through the GOT reach function starts" % (path.name, len(code.insns), len(code.l32r), code.start,
                                                     len(code.called_l32r)))
    return 0


if __name__ == "__main__":
    run_tool("xtensa_mpy", main)
