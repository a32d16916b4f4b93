"""Instructions per multiply-accumulate of the native matmul's inner loops, as the boards' cores run them.

    python -m specmesh.tools.native_loops [--json]

Disassembles `k_matmul` (what matmul and layer run) in the objects `make native` builds
(build/native/<arch>/kernels.o, the code of the shipped firmware/native/<arch>.mpy): rv32imc with Debian's riscv64-unknown-elf-objdump, xtensawin with
llvm-objdump-22 (-mcpu=esp32). Each innermost loop (a backward branch, or a zero-overhead `loop`, and the
range it closes: tools/xtensa_loops.py's longest path through one iteration) is identified by what it
does: U byte loads of weights (columns per iteration) and G*U multiplies (positions per group), so its
instructions per MAC are insns / (G*U). Reported for the loops a pass of 1 and of 5 positions runs
(firmware/native/kernels.c: `group` with x contiguous, four columns an iteration). On xtensawin the models'
rows (up to MAC16_COLS columns, a multiple of 4) run on MAC16 instead (`mac16_matmul`), whose loops are
functions of their own: one position is `mac16_row1`'s loop over a weight word (4 MACs), a pass of 5 is
`mac16_expand`'s (a row's word, once) and five of `mac16_dot`'s (4 MACs each); those are xtensawin's
figures. host/projection/hardware.py keeps these figures (NATIVE_MATMUL_INSNS_PER_MAC);
tests/test_native_loops.py checks that they agree.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from specmesh.tools import run_tool
from specmesh.tools.xtensa_loops import Loop, ToolError, loops

ROOT = Path(__file__).resolve().parent.parent
# arch -> (disassembler command, weight byte load, multiply)
ARCHES = {
    "rv32imc": (["riscv64-unknown-elf-objdump", "-d", "--no-show-raw-insn"], ("lb",), ("mul",)),
    "xtensawin": (["llvm-objdump-22", "-d", "--no-show-raw-insn", "--mcpu=esp32"], ("l8ui",), ("mull",)),
}
PACKAGES = {"riscv64-unknown-elf-objdump": "binutils-riscv64-unknown-elf", "llvm-objdump-22": "llvm-22"}


@dataclass(frozen=True)
class InnerLoop:
    """One innermost loop of matmul: its instructions per iteration, columns (U) and positions (G) per
    iteration."""

    lo: int
    insns: int
    columns: int
    positions: int

    @property
    def per_mac(self) -> float:
        return self.insns / (self.columns * self.positions)


def object_path(arch: str) -> Path:
    return ROOT / "build" / "native" / arch / "kernels.o"


def disassemble(arch: str, function: str = "k_matmul") -> list[tuple[int, str, str]]:
    """(address, mnemonic, operands) of one function of the arch's object; branch targets as 0x... ."""
    cmd = ARCHES[arch][0]
    if shutil.which(cmd[0]) is None:
        raise ToolError("%s is missing: apt-get install %s" % (cmd[0], PACKAGES[cmd[0]]))
    obj = object_path(arch)
    if not obj.is_file():
        raise ToolError("%s is missing: run `make native`" % obj.relative_to(ROOT))
    done = subprocess.run([*cmd, str(obj)], capture_output=True, text=True)
    if done.returncode:  # an object cut short or overwritten: objdump's last line says what it met
        raise ToolError("%s cannot read %s (%s): run `make native` again" % (
            cmd[0], obj, (done.stderr.strip().splitlines() or ["exit status %d" % done.returncode])[-1]))
    text = done.stdout
    code, inside = [], False
    for line in text.splitlines():
        head = re.match(r"^[0-9a-f]+ <(\S+)>:", line)
        if head and not head.group(1).startswith(".L"):  # gcc's local labels are inside the function
            inside = head.group(1) == function
            continue
        m = re.match(r"\s*([0-9a-f]+):\s+(\S+)\s*(.*)$", line)
        if inside and m:
            ops = re.sub(r"\s*[#<].*$", "", m.group(3)).strip()
            mnem = m.group(2)
            if mnem.startswith(("b", "j", "loop")) and mnem not in ("jalr", "jr", "jx"):
                # the branch target, the last operand, as 0x... (riscv objdump prints it bare)
                ops = re.sub(r"(?:0x)?([0-9a-f]+)$", lambda t: "0x" + t.group(1), ops)
            code.append((int(m.group(1), 16), mnem, ops))
    if not code:
        raise ToolError("no function %s in %s" % (function, obj))
    return code


def zero_overhead(code: list[tuple[int, str, str]]) -> list[Loop]:
    """Xtensa's `loop`/`loopnez`/`loopgtz` loops: the body from the next instruction to the end label."""
    out = []
    for i, (addr, mnem, ops) in enumerate(code):
        if mnem.startswith("loop"):
            end = int(ops.rsplit("0x", 1)[1], 16)
            body = [c for c in code[i + 1:] if c[0] < end]
            out.append(Loop(body[0][0], body[-1][0], len(body), 0, True))
    return out


def inner_loops(arch: str) -> list[InnerLoop]:
    return classify(disassemble(arch), arch)


def classify(code: list[tuple[int, str, str]], arch: str) -> list[InnerLoop]:
    """The innermost loops of `code` that multiply weight bytes, with their columns and positions."""
    _, byte_loads, muls = ARCHES[arch]
    found = []
    zol = [c[0] for c in code if c[1].startswith("loop")]
    # a branch loop around a zero-overhead loop (a row loop) is not innermost
    branch = [lp for lp in loops(code) if lp.inner and not any(lp.lo <= a <= lp.hi for a in zol)]
    for lp in branch + zero_overhead(code):
        body = [c for c in code if lp.lo <= c[0] <= lp.hi]
        u = sum(m in byte_loads for _, m, _ in body)
        k = sum(m in muls for _, m, _ in body)
        if u and k % u == 0:
            found.append(InnerLoop(lp.lo, lp.insns, u, k // u))
    return found


def per_mac(arch: str) -> dict[int, float]:
    """{positions: instructions per MAC} of the loops a pass of 1 and of 5 positions runs (four columns
    an iteration: x contiguous, its stride known at compile time). kernels.c has two such loops per group
    size, for rows of a multiple of four columns (every model's) and for the others; the first is the
    shorter or as short, and is the one counted."""
    found = inner_loops(arch)
    out = {}
    for g in (1, 5):
        match = [lp for lp in found if lp.positions == g and lp.columns == 4]
        if len(match) != 2:
            raise ToolError("%s: found %d unrolled loops of %d position(s) in matmul, not 2: kernels.c changed"
                            % (arch, len(match), g))
        out[g] = min(lp.per_mac for lp in match)
    return out


# xtensawin's MAC16 functions, one loop each: the multiplies of one iteration (a weight word)
MAC16_MACS = {"mac16_row1": 4, "mac16_expand": 0, "mac16_dot": 4}


def mac16_loops() -> dict[str, int]:
    """{function: instructions of one iteration} of the MAC16 functions of the xtensawin object, each checked to
    have one zero-overhead loop with MAC16_MACS multiplies."""
    out = {}
    for function in MAC16_MACS:
        code = disassemble("xtensawin", function)
        found = zero_overhead(code)
        if len(found) != 1:
            raise ToolError("xtensawin: %s has %d loops, not 1: kernels.c changed" % (function, len(found)))
        lp = found[0]
        macs = sum(m.startswith("mula.") for a, m, _ in code if lp.lo <= a <= lp.hi)
        if macs != MAC16_MACS[function]:
            raise ToolError("xtensawin: %s multiplies %d times an iteration, not %d: kernels.c changed"
                            % (function, macs, MAC16_MACS[function]))
        out[function] = lp.insns
    return out


def mac16_per_mac(found: dict[str, int] | None = None) -> dict[int, float]:
    """{positions: instructions per MAC} of xtensawin's MAC16 passes (`found`: mac16_loops(), counted if not
    given): one position, an iteration of mac16_row1 per weight word of 4 columns; five, one mac16_expand
    iteration per word and five of mac16_dot's."""
    n = found or mac16_loops()
    return {1: n["mac16_row1"] / 4, 5: (n["mac16_expand"] + 5 * n["mac16_dot"]) / 20}


def count(mac16: dict[str, int] | None = None) -> dict[str, dict[int, float]]:
    """Every arch's per_mac figures (xtensawin's from its MAC16 loops, `mac16` if already counted)."""
    return {arch: mac16_per_mac(mac16) if arch == "xtensawin" else per_mac(arch) for arch in ARCHES}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specmesh.tools.native_loops", description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = ap.parse_args(argv)
    try:
        found = {arch: inner_loops(arch) for arch in ARCHES}
        mac16 = mac16_loops()
        figures = count(mac16)
    except ToolError as e:
        print("native_loops: %s" % e, file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps({"matmul_per_mac": figures,
                          "loops": {arch: [vars(lp) for lp in ls] for arch, ls in found.items()}}))
        return 0
    print("native matmul inner loops (instructions of one iteration / columns x positions = per MAC)")
    for arch, ls in found.items():
        for lp in ls:
            print("%-10s %3d insns / %d x %d = %.2f per MAC" % (arch, lp.insns, lp.columns, lp.positions, lp.per_mac))
    for function, insns in mac16.items():
        print("xtensawin  %3d insns an iteration of %s (MAC16)" % (insns, function))
    for arch, f in figures.items():
        print("%s matmul, instructions per MAC: 1 position %.2f, 5 positions %.2f" % (arch, f[1], f[5]))
    return 0


if __name__ == "__main__":
    run_tool("native_loops", main)
