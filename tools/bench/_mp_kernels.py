"""Timed workload of the kernels benchmark, run by the `micropython` binary (tools/bench/kernels.py).

    micropython tools/bench/_mp_kernels.py ENGINE_DIR DRAFTER TARGET BUDGET_MS [KERNELS]   prints one JSON object

ENGINE_DIR holds the engine to measure (engine.py, kernels.py; `firmware` for today's, or an older one
with its own shared/); KERNELS (today's engine only): `native` (the C kernels, firmware/native/x64.mpy,
as a node picks them) or `viper`. Figures, each also as a multiple of `ref_us`, a fixed interpreted-Python
workload timed in the same process, so that machine noise cancels in ratios between runs:
- per-token time of the drafter and the target, greedy, one position per forward at position 32
  (viper), and the heap bytes one token allocates (GC disabled);
- v(k) = time of one forward over k positions / time over 1, k = 1..8, with the target, after a
  32-token prefix, rolling back after each pass as verify rounds do (fastest pass of 3 interleaved
  rounds);
- with today's engine: MAC/s of the matmul kernel, native, viper and the plain-Python reference.
"""

import gc
import json
import sys
from array import array

sys.path[:0] = [sys.argv[1], ".", "host/projection/mpy"]  # run from the repository root (tools/bench/kernels.py)

from engine import Engine
from timing import best, greedy_step  # the harness `specmesh bench` times a board with

BUDGET_US = int(sys.argv[4]) * 1000
KERNELS = sys.argv[5] if len(sys.argv) > 5 else ""


def engine(path, kmax):
    """The engine under test: today's with the kernels asked for, or an older one as it was."""
    if not KERNELS:
        return Engine(path, kmax)
    e = Engine(path, kmax, native=KERNELS == "native")
    if e.kernels != KERNELS:
        raise SystemExit("the engine runs %s kernels, not %s" % (e.kernels, KERNELS))
    return e


def timed(fn, *args):
    """Microseconds of the fastest call of fn(*args) over BUDGET_US / 4 (at least 5 calls)."""
    return best(fn, args, 5, BUDGET_US // 4, 0)


def reference():
    s = 0
    for i in range(20000):
        s += (i * 3) ^ (i >> 2)
    return s


def macs():
    import kernelpick
    import kernels
    import refkernels
    rows = cols = 256
    w = bytearray((i * 37 + 11) & 255 for i in range(rows * cols))
    out = {}
    for k in (1, 5):
        x = array("i", (((i * 101 + 7) & 0xFFFF) - 32768 for i in range(k * cols)))
        p = array("i", range(16 + k * rows))
        p[0], p[1], p[2], p[3] = rows, cols, k, 0
        for name, fn in (("native", kernelpick.pick()[0].matmul), ("viper", kernels.matmul),
                         ("python", refkernels.matmul)):
            out["%s_k%d" % (name, k)] = rows * cols * k / timed(fn, w, x, 0, p) * 1e6
    return out


def verify_cost(path):
    e = engine(path, 8)
    prefix = 32
    toks = [(7 * i + 3) % e.vocab for i in range(prefix + 8)]
    for p in range(0, prefix, 8):
        e.forward(toks[p:p + 8], p)
    times = {}
    for _ in range(3):  # interleaved rounds, fastest kept: other processes only ever add time
        for k in range(1, 9):
            batch = toks[prefix:prefix + k]

            def one():
                e.forward(batch, prefix)
                e.rollback(prefix)
            t = timed(one)
            times[k] = min(times.get(k, t), t)
    return {"us": [times[k] for k in range(1, 9)], "v": [times[k] / times[1] for k in range(1, 9)]}


def per_token(path):
    """Greedy tokens at position 32 (after a 32-token prefix, rolled back after each): the fastest
    token, and the heap bytes one token allocates."""
    gc.collect()
    e = engine(path, 1)
    step = greedy_step(e)
    us = timed(step)
    gc.collect()
    gc.disable()
    b0 = gc.mem_alloc()
    step()
    allocated = gc.mem_alloc() - b0
    gc.enable()
    return {"us_per_token": us, "bytes_per_token": allocated, "heap_bytes": e.heap_bytes}


ref_us = min(timed(reference) for _ in range(3))
out = {"ref_us": ref_us, "drafter": per_token(sys.argv[2])}
gc.collect()
out["target"] = per_token(sys.argv[3])
gc.collect()
out["verify"] = verify_cost(sys.argv[3])
if KERNELS == "native":
    out["macs"] = macs()
print(json.dumps(out))
