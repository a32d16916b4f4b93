"""RV32 benchmark: instructions executed on a virtual ESP32-C3, measured by the board itself.

    python -m specmesh.tools.bench rv32

A virtual ESP32-C3 (host/emulator/qemu.py: MicroPython's RV32 machine code under qemu-system-riscv32
-icount shift=0, where time.ticks_cpu() counts executed instructions) is flashed with the node and the target
(build/vboards/bench-esp32c3, kept between runs), and runs tools/bench/_board_probe.py (tools/bench/_qemu.py):
- the matmul's executed instructions per multiply-accumulate for 1 and 5 positions (a 64 x 172 matmul less the
  same call without rows), native and viper kernels, next to the static count of the native inner loops
  (tools/native_loops.py, from the rv32imc disassembly; needs `make native`);
- each kernel's executed instructions in one engine pass of 1 and of 5 positions (after 8 cached ones), and the
  pass's total (the rest: engine.py's interpreted code between kernels), next to host/projection/costmodel.py's
  static Xtensa count of the same terms for the same pass (what the ESP32/S3 projection assumes).
Skipped, with the reason, where QEMU is not installed.
"""

from __future__ import annotations

import shutil

from specmesh.host.layout import ROOT, TARGET_FILE
from specmesh.tools.bench._qemu import probe

CTX = 8  # cached positions before the measured passes (tools/bench/_board_probe.py)
# costmodel terms of each firmware kernel
TERMS = {"matmul": ("matmul_1", "matmul_5"), "quant": ("requant",), "requant": ("residual",), "rmsnorm": ("rmsnorm",),
         "rope": ("rope",), "attend": ("softmax", "kv_reads"), "silu": ("silu",), "embed": ("embed_argmax",),
         "argmax": ()}


def static_native() -> dict[int, float] | str:
    try:
        from specmesh.tools.native_loops import per_mac

        return per_mac("rv32imc")
    except Exception as e:  # noqa: BLE001 - no build/native objects (make native) or no objdump
        return "n/a (%s)" % str(e).strip().splitlines()[0][:80]


def xtensa_static(k: int) -> dict[str, float]:
    from specmesh.host.backends.modelio import check_model_file
    from specmesh.host.projection.costmodel import pass_work

    h = check_model_file(ROOT / "models" / TARGET_FILE)[0]
    return dict(pass_work(h, k, CTX + k))


def run() -> dict:
    if shutil.which("qemu-system-riscv32") is None:
        print("skipped: qemu-system-riscv32 is not installed (apt-get install qemu-system-misc)")
        return {"skipped": "no qemu-system-riscv32"}
    got = probe("esp32c3")
    static = static_native()
    print("matmul, executed instructions per MAC on rv32imc (QEMU):")
    for k in (1, 5):
        row = ["%d position%s" % (k, "" if k == 1 else "s")]
        for name in ("native", "viper"):
            v = got.get(name, {}).get("per_mac", {}).get(k)
            row.append("%s %s" % (name, "%.2f" % v if v is not None else "-"))
        row.append("native static inner loop %s" % ("%.2f" % static[k] if isinstance(static, dict) else static))
        print("  " + ", ".join(row))
    out = {"per_mac": {name: got[name].get("per_mac") for name in got}, "native_static_per_mac": static,
           "passes": {}}
    for k in (1, 5):
        xt = xtensa_static(k)
        print("one pass of %d position%s after %d: executed instructions by kernel" % (k, "" if k == 1 else "s", CTX))
        print("  %-8s %12s %12s %16s" % ("kernel", "native", "viper", "xtensa static"))
        rows = {}
        for name in ("native", "viper"):
            if "passes" in got.get(name, {}):
                total, per = got[name]["passes"][k]
                rows[name] = dict(per, total=total, between=total - sum(per.values()))
        for kern in sorted({key for r in rows.values() for key in r if key not in ("total", "between")}) + [
                "between", "total"]:
            xs = sum(xt.get(t, 0.0) for t in TERMS.get(kern, ()))
            if kern == "total":
                xs = sum(v for t, v in xt.items() if t in {x for ts in TERMS.values() for x in ts})
            print("  %-8s %12s %12s %16s" % (kern, *("%d" % rows[n][kern] if n in rows and kern in rows[n] else "-"
                                                      for n in ("native", "viper")),
                                             "%d" % xs if xs else "-"))
        out["passes"][k] = {"measured": rows, "xtensa_static": xt}
    return out
