#!/usr/bin/env python3
"""Fix-ups to llc-22's Xtensa assembly before llvm-mc-22 assembles it (xtensa/tools/xcc runs it on every C file).

1. Literal pools: each function's `.literal` entries become plain words in its own text section, just before it,
   so every L32R resolves inside its section (no linker-side literal placement; an image over 256 KiB breaks
   "all literals before all text", L32R's reach).
2. The varargs frame pointer (an LLVM 22 bug, xtensa/README.md): in a variadic function that needs a frame
   pointer, llc sets it up (`or a7, a1, a1`, a7 being the windowed ABI's frame pointer) before it saves the
   incoming argument register a7 to the varargs save area (`s32i a7, a7, N`), so the sixth argument register's
   value is lost. The save moves before the set-up, addressed from a1 (equal to a7 right after it).
Usage: fixasm.py IN.s OUT.s
"""

import re
import sys

FP_SETUP = "or\ta7, a1, a1"
A7_SAVE = re.compile(r"s32i\ta7, a7, (\d+)$")


def literals(lines):
    out, pending, waiting = [], [], False
    for line in lines:
        s = line.strip()
        if s == ".literal_position":
            waiting = True
            continue
        m = re.match(r"\.literal\s+([^,]+),\s*(.*)$", s)
        if m:
            pending.append((m.group(1), m.group(2)))
            waiting = True
            continue
        if waiting and (s.startswith(".section") or s == ".text" or s == "" or s.startswith("#")):
            out.append(line)
            continue
        if waiting:
            if pending:
                out.append("\t.p2align\t2")
                for name, expr in pending:
                    out.append("%s:\n\t.long\t%s" % (name, expr))
            pending, waiting = [], False
        out.append(line)
    assert not pending, "literals after the last function"
    return out


def varargs_fp(lines):
    out = list(lines)
    for i, line in enumerate(out):
        if line.strip() != FP_SETUP or i == 0 or not out[i - 1].strip().startswith("entry\t"):
            continue
        for j in range(i + 1, min(i + 8, len(out))):  # the save area is written first thing
            m = A7_SAVE.match(out[j].strip())
            if m:
                del out[j]
                out.insert(i, "\ts32i\ta7, a1, %s" % m.group(1))
                break
    return out


def main(src, dst):
    with open(src) as f:
        lines = f.read().splitlines()
    with open(dst, "w") as f:
        f.write("\n".join(varargs_fp(literals(lines))) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
