"""Executed instructions per forward pass, on a board whose CPU counter counts instructions.

On the project's virtual RV32 boards (rv32/: MicroPython's qemu port under `qemu-system-riscv32 -icount
shift=0`) time.ticks_cpu() reads the minstret CSR, which QEMU advances by one per executed instruction:
the node counts each pass's instructions, by the positions it held (`k`), and reports them in STATS
("insn_k<k>": thousands of instructions over "passes_k<k>" passes; "insn_last": the exact count of the
last pass). Elsewhere ticks_cpu counts cycles or nothing, and the node reports no counts.

A count covers the engine's pass alone, which allocates nothing, so no garbage collection falls inside it;
the node's request handling around it (frames, the collections its garbage causes) is not counted.
"""

import sys
import time

COUNTS = "qemu" in getattr(sys.implementation, "_machine", "")

_insn = {}  # k -> [passes, instructions] since boot
_last = [0]


def start():
    """The counter now (0 where instructions are not counted)."""
    return time.ticks_cpu() if COUNTS else 0


def stop(t0, k):
    """A pass over k positions that started at counter t0 is done."""
    if COUNTS:
        n = time.ticks_diff(time.ticks_cpu(), t0)
        _last[0] = n
        b = _insn.get(k)
        if b is None:
            b = _insn[k] = [0, 0]
        b[0] += 1
        b[1] += n


def pairs():
    """STATS pairs of the counts (none where instructions are not counted)."""
    if not COUNTS:
        return []
    out = [("insn_last", _last[0])]
    for k in sorted(_insn):
        b = _insn[k]
        out.append(("passes_k%d" % k, b[0]))
        out.append(("insn_k%d" % k, b[1] // 1000))
    return out
