# Board code (MicroPython), run by tools/bench/_qemu.py on a flashed virtual board that executes its class's own
# machine code under QEMU -icount shift=0, where time.ticks_cpu() counts executed instructions (exactly on the
# RV32 boards, to 25 on the Xtensa ones: xtensa/README.md): for the native and the viper kernels the matmul's
# executed instructions per MAC for 1 and 5 positions, on the target's 64 x 172 less the same call with no rows
# (the rows' own cost) and on a 512 x 64 matrix with the call and every row's setup included; each kernel's
# executed instructions in one engine pass of 1 and of 5 positions after 8 cached ones, and the pass's total;
# with main(units_too=True) also the native kernels' executed instructions at the sizes tools/bench/xtensa.py
# fits its per-unit costs to. The caller appends the main(...) call; it prints one repr'd dict.
import gc
import json
import time
from array import array

import engine
import kernelpick

_T = time.ticks_cpu
_D = time.ticks_diff
CTX = 8  # cached positions before the measured passes
REPS = 16  # calls per units() count: a tick of the Xtensa boards' counter is 25 instructions


def per_mac(mod, rows, cols, k, base):
    """Executed instructions per MAC of a rows x cols matmul of k positions (less the same call with no rows
    when `base`)."""
    w = bytearray((i * 37) & 0xFF for i in range(rows * cols))
    x = array("i", ((i * 7) % 255 - 127 for i in range(cols * k + 1)))
    p = array("i", [0] * (16 + k * rows))
    p[1], p[2], p[3] = cols, k, 0
    out = []
    for n in (rows, 0) if base else (rows,):
        p[0] = n
        mod.matmul(w, x, 0, p)  # warm: nothing of the measured call is a first time
        t = _T()
        mod.matmul(w, x, 0, p)
        out.append(_D(_T(), t))
    return (out[0] - (out[1] if base else 0)) / (rows * cols * k)


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
            n[name] = n.get(name, 0) + _D(_T(), t)
            return r

        return call


def per_kernel(e, k):
    """(instructions of the pass, {kernel: its instructions}): the pass once as it runs, then again with
    each kernel call counted (the counting's own calls are not the pass's, so the total is the first)."""
    tokens = bytes(k)
    e.rollback(CTX)
    gc.collect()  # no collection inside the pass: what it does is the pass's own work
    t = _T()
    e.forward(tokens, CTX)
    total = _D(_T(), t)
    real = e.kern
    c = e.kern = Counting(real)
    e.rollback(CTX)
    gc.collect()
    e.forward(tokens, CTX)
    e.kern = real
    return total, c.n


def count(f, *a):
    """Executed instructions of REPS calls of f(*a) (after one more): the host divides."""
    f(*a)
    gc.collect()  # no collection inside the measured calls
    t = _T()
    for _ in range(REPS):
        f(*a)
    return _D(_T(), t)


def fill(buf, n, lo, hi, c):
    span = hi - lo + 1
    for i in range(n):
        buf[i] = lo + (i * i * 7919 + i * 104729 + c * 3571) % span


def units(K):
    """Executed instructions of REPS calls of each kernel at the sizes tools/bench/xtensa.py fits its per-unit
    costs to: {(kernel, sizes...): instructions}."""
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


def main(units_too=False):
    with open("specmesh.json") as f:
        model = json.load(f)["model"]  # where `specmesh flash` put the target (ROMFS or the filesystem)
    out = {}
    for name, native in (("native", True), ("viper", False)):
        mod, got = kernelpick.pick(True, native)
        if got != name:
            out[name] = {"error": "kernels: " + kernelpick.describe(got)}
            continue
        row = {"per_mac": {k: per_mac(mod, 64, 172, k, True) for k in (1, 5)},
               "per_mac_call": {k: per_mac(mod, 512, 64, k, False) for k in (1, 5)}}
        if units_too and native:
            row["units"], row["reps"] = units(mod), REPS
        gc.collect()
        e = engine.Engine(model, 5, True, 96, native=native)
        e.forward(bytes(4), 0)  # a context of CTX positions, then passes of 1 and 5 positions after it
        e.forward(bytes(4), 4)
        row["passes"] = {k: per_kernel(e, k) for k in (1, 5)}
        e = None
        gc.collect()
        out[name] = row
    print(repr(out))
