# Board code (MicroPython), run by tools/bench/rv32.py on a virtual ESP32-C3 (QEMU, -icount shift=0), where
# time.ticks_cpu() counts executed instructions: the matmul's instructions per MAC (a 64 x 172 matmul, less
# the same call with no rows) and the instructions each kernel executes in one engine pass, for the native
# and the viper kernels. Prints one repr'd dict.
import gc
import time
from array import array

import engine
import kernelpick

_T = time.ticks_cpu
_D = time.ticks_diff


def per_mac(mod, k, rows=64, cols=172):
    w = bytearray((i * 37) & 0xFF for i in range(rows * cols))
    x = array("i", ((i * 7) % 200 - 100 for i in range(cols * k + 1)))
    p = array("i", range(16 + k * rows))
    p[1], p[2], p[3] = cols, k, 0
    out = []
    for n in (rows, 0):
        p[0] = n
        t = _T()
        mod.matmul(w, x, 0, p)
        out.append(_D(_T(), t))
    return (out[0] - out[1]) / (rows * cols * k)


class Counting:
    """The kernel module, each call's executed instructions added to its kernel's count."""

    def __init__(self, mod):
        self.mod = mod
        self.n = {}

    def __getattr__(self, name):
        f = getattr(self.mod, name)
        n = self.n

        def call(*a):
            t = _T()
            r = f(*a)
            d = _D(_T(), t)
            n[name] = n.get(name, 0) + d
            return r

        return call


def per_kernel(e, k, pos):
    """(instructions of the pass, {kernel: its instructions}): the pass once as it runs, then again with
    each kernel call counted (the counting's own calls are not the pass's, so the total is the first)."""
    e.rollback(pos)
    tokens = bytes(k)
    gc.collect()  # no collection inside the pass: what it does is the pass's own work
    t = _T()
    e.forward(tokens, pos)
    total = _D(_T(), t)
    real = e.kern
    c = e.kern = Counting(real)
    e.rollback(pos)
    gc.collect()
    e.forward(tokens, pos)
    e.kern = real
    return total, c.n


out = {}
for name, native in (("native", True), ("viper", False)):
    mod, got = kernelpick.pick(True, native)
    if got != name:
        out[name] = {"error": "kernels: " + kernelpick.describe(got)}
        continue
    row = {"per_mac": {k: per_mac(mod, k) for k in (1, 5)}}
    gc.collect()
    e = engine.Engine(MODEL, 5, True, 96, native=native)  # noqa: F821 - rv32.py sets MODEL above this script
    e.forward(bytes(4), 0)  # a context of 8 positions, then passes of 1 and 5 positions after it
    e.forward(bytes(4), 4)
    for k in (1, 5):
        row["pass_%d" % k] = per_kernel(e, k, 8)
    e = None
    gc.collect()
    out[name] = row
print(repr(out))
