# Board code (MicroPython), run by tools/bench/xtensa.py on an Xtensa MicroPython under qemu-system-xtensa
# -cpu dc233c -icount shift=0, where CCOUNT (time.ticks_cpu()) advances once per 100 executed instructions:
# the native matmul's executed instructions per MAC for 1 and 5 positions on a 512 x 64 matrix (the call
# and every row's setup included) and on the target's 64 x 172 (less the same call with no rows: the rows'
# own cost), and the same for viper, in thousandths of an instruction. Prints one repr'd dict.
import sys
import time
from array import array

sys.path[:0] = ["."]
import kernels  # noqa: E402
import native.xtensawin as nat  # noqa: E402

_T = time.ticks_cpu
_D = time.ticks_diff
TICK = 100  # executed instructions per CCOUNT tick under -icount shift=0 on dc233c


def run(mod, rows, cols, k, base):
    w = bytearray((i * 37) & 0xFF for i in range(rows * cols))
    x = array("i", ((i * 7) % 255 - 127 for i in range(cols * k + 1)))
    p = array("i", [0] * (16 + k * rows))
    p[1], p[2], p[3] = cols, k, 0
    out = []
    for n in (rows, 0) if base else (rows,):
        p[0] = n
        mod.matmul(w, x, 0, p)  # warm: the first call may allocate or fault in nothing, but be sure
        t = _T()
        mod.matmul(w, x, 0, p)
        out.append(_D(_T(), t) * TICK)
    return (out[0] - (out[1] if base else 0)) * 1000 // (rows * cols * k)  # thousandths: no floats on dc233c


res = {}
for name, mod in (("native", nat), ("viper", kernels)):
    res[name] = {"512x64": {k: run(mod, 512, 64, k, False) for k in (1, 5)},
                 "64x172": {k: run(mod, 64, 172, k, True) for k in (1, 5)}}
print(repr(res))
