# Board code (MicroPython), run by tools/bench/xtensa.py on an Xtensa MicroPython under qemu-system-xtensa
# -cpu dc233c -icount shift=0, where CCOUNT (time.ticks_cpu()) advances once per 100 executed instructions:
# the native matmul's executed instructions per MAC for 1 and 5 positions on a 512 x 64 matrix (the call
# and every row's setup included) and on the target's 64 x 172 (less the same call with no rows: the rows'
# own cost), and the same for viper, in thousandths of an instruction; then, when the target model is
# beside it (target.spm), the executed instructions of one engine pass of 1 and of 5 positions after 8
# cached ones, native and viper, in total and by kernel. Prints one repr'd dict.
import gc
import sys
import time
from array import array

sys.path[:0] = ["."]
import kernels
import native.xtensawin as nat

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


class Counting:
    """A kernel module, each call's executed instructions added to its kernel's count."""

    def __init__(self, mod):
        self.mod = mod
        self.n = {}

    def __getattr__(self, name):
        f = getattr(self.mod, name)
        n = self.n

        def call(*a):
            t = _T()
            r = f(*a)
            n[name] = n.get(name, 0) + _D(_T(), t) * TICK
            return r

        return call


def passes(native):
    import engine

    e = engine.Engine("target.spm", 5, True, 96, native=native)
    e.forward(bytes(4), 0)
    e.forward(bytes(4), 4)  # 8 cached positions
    out = {}
    for k in (1, 5):
        e.rollback(8)
        gc.collect()
        t = _T()
        e.forward(bytes(k), 8)
        total = _D(_T(), t) * TICK
        real = e.kern
        c = e.kern = Counting(real)
        e.rollback(8)
        gc.collect()
        e.forward(bytes(k), 8)
        e.kern = real
        out[k] = (total, c.n)
    return out


REPS = 16  # calls per count: a tick is 100 instructions


def count(f, *a):
    """Executed instructions of REPS calls of f(*a) (after one more): tools/bench/xtensa.py divides."""
    f(*a)
    gc.collect()  # no collection inside the measured calls
    t = _T()
    for _ in range(REPS):
        f(*a)
    return _D(_T(), t) * TICK


def fill(buf, n, lo, hi, c):
    span = hi - lo + 1
    for i in range(n):
        buf[i] = lo + (i * i * 7919 + i * 104729 + c * 3571) % span


def units(K):
    """Executed instructions of each kernel at the sizes tools/bench/xtensa.py fits its per-unit costs to:
    {(kernel, sizes...): instructions}."""
    from shared import intmath

    out = {}
    w = bytearray(172 * 172)
    fill(w, len(w), 0, 255, 1)
    x = array("i", [0] * (172 * 5 + 1))
    fill(x, len(x), -20000, 20000, 2)
    p = array("i", [0] * (16 + 172 * 5))
    for k in (1, 2, 3, 4, 5):
        for rows, cols in ((0, 172), (64, 64), (64, 172)):
            p[0], p[1], p[2], p[3] = rows, cols, k, 0
            out[("matmul", k, rows, cols)] = count(K.matmul, w, x, 0, p)
    src = array("i", [0] * (172 * 4))
    fill(src, len(src), -(1 << 20), 1 << 20, 3)
    dst = array("i", [0] * (172 * 4 + 8))
    q = array("i", [0] * 16)
    for rows, n in ((1, 64), (4, 64), (4, 172)):
        q[0], q[1], q[2], q[3], q[4], q[5], q[6] = 0, n, 0, 15, rows, rows, 1
        out[("quant", rows, n)] = count(K.quant, dst, src, q)
    ms = array("i", [0] * 172)
    for r in range(172):
        ms[r] = (8192 + r * 37) | (30 + r % 5) << 16
    for n in (64, 172):
        q[0], q[1], q[2], q[3], q[4], q[5], q[8] = n, 1, 0, n, 0, 0, 4
        out[("requant", n)] = count(K.requant, dst, src, ms, q)
    wn = array("i", [0] * 172)
    fill(wn, 172, 8000, 16000, 4)
    for k, dim in ((1, 64), (4, 64), (1, 172)):
        q[0], q[1], q[2], q[3] = dim, k, 13, 42950
        out[("rmsnorm", k, dim)] = count(K.rmsnorm, dst, src, wn, q)
    cs = array("h", [0] * (68 * 4))
    fill(cs, len(cs), -16384, 16384, 5)
    for heads in (4, 8):
        q[0], q[1], q[2], q[3] = 1, heads, 4, 40
        out[("rope", heads)] = count(K.rope, dst, cs, q)
    for hd, n, heads in ((8, 8, 8), (8, 40, 8), (12, 8, 8), (12, 40, 8), (16, 8, 8), (16, 40, 8), (8, 8, 4)):
        group = 2
        stride = hd * heads // group + 1
        kv = bytearray(2 * 40 * stride)
        fill(kv, len(kv), 0, 255, 6)
        for t in range(80):
            kv[t * stride + stride - 1] = t % 5
        qv = array("i", [0] * (heads * hd))
        fill(qv, len(qv), -(1 << 18), 1 << 18, 7)
        sc = array("i", [0] * (40 + 16 + intmath.EXP_SIZE))
        intmath.exp_table(memoryview(sc)[56:])
        pa = array("i", (n, hd, stride, 0, 40 * stride, heads, group, 8192, 1, 40, 56))
        out[("attend", hd, n) if heads == 8 else ("attend", hd, n, heads)] = count(K.attend, qv, kv, sc, pa)
    tab = array("i", [0] * intmath.EXP_SIZE)
    intmath.exp_table(tab)
    h1 = array("i", [0] * 172)
    for n in (64, 172):
        fill(h1, 172, -(1 << 18), 1 << 18, 8)
        q[0], q[1] = n, 1
        out[("silu", n)] = count(K.silu, h1, src, tab, q)
    for dim in (64, 172):
        q[0], q[1], q[2] = dim, 3, 0
        out[("embed", dim)] = count(K.embed, dst, w, ms, q)
    for n in (64, 512):
        a = array("i", [0] * 512)
        fill(a, 512, -100000, 100000, 9)
        q[0], q[1] = 0, n
        out[("argmax", n)] = count(K.argmax, a, q)
    return out


res = {}
for name, mod in (("native", nat), ("viper", kernels)):
    res[name] = {"512x64": {k: run(mod, 512, 64, k, False) for k in (1, 5)},
                 "64x172": {k: run(mod, 64, 172, k, True) for k in (1, 5)}}
res["native"]["units"] = units(nat)
res["native"]["reps"] = REPS
gc.collect()
try:
    open("target.spm").close()
    have_model = True
except OSError as e:
    have_model = False
    res["native"]["no_passes"] = "no target.spm: %r" % e
if have_model:
    for name in ("native", "viper"):
        try:
            res[name]["passes"] = passes(name == "native")
        except Exception as e:  # noqa: BLE001 - a heap too small, no float or os module: the figures above stand alone
            res[name]["no_passes"] = repr(e)
        gc.collect()
print(repr(res))
