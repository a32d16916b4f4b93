"""Timed workload of the kernels benchmark, run by the `micropython` binary (tools/bench/kernels.py).

    micropython tools/bench/_mp_kernels.py DRAFTER TARGET BUDGET_MS   prints one JSON object

- MAC/s of the int8 matmul, viper kernel and plain-Python fallback, on a 256 x 256 matrix for k = 1
  and k = 4 positions;
- v(k) = time of one forward over k positions / time over 1, k = 1..8, with the target model (viper),
  after a 32-token prefix, rolling back after each pass as verify rounds do (fastest of 3 rounds);
- greedy tokens/s of the drafter and the target, one position per forward (viper), and the heap each
  engine holds and the bytes one token allocates transiently (boxed floats; nothing is retained).
"""

import gc
import json
import sys
from time import ticks_diff, ticks_us

sys.path[:0] = ["firmware", "."]

import kernels  # noqa: E402
from engine import Engine, _matmul_py  # noqa: E402

BUDGET_US = int(sys.argv[3]) * 1000 if len(sys.argv) > 3 else 300000


def timed(fn, *args):
    """Microseconds per call of fn(*args): repeat until BUDGET_US / 4 has passed (at least twice)."""
    fn(*args)
    n = 0
    t0 = ticks_us()
    while True:
        fn(*args)
        n += 1
        dt = ticks_diff(ticks_us(), t0)
        if n >= 2 and dt >= BUDGET_US // 4:
            return dt / n


def macs():
    from array import array
    rows = cols = 256
    w = bytearray((i * 37 + 11) & 255 for i in range(rows * cols))
    out = {}
    for k in (1, 4):
        x = bytearray((i * 101 + 7) & 255 for i in range(k * cols))
        acc = array("i", range(k * rows))
        p = array("i", (rows, cols, k, 0))
        for name, fn in (("viper", kernels.matmul), ("python", _matmul_py)):
            us = timed(fn, acc, w, x, p)
            out["%s_k%d" % (name, k)] = rows * cols * k / us * 1e6
    return out


def verify_cost(path):
    e = Engine(path, 8)
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


def tokens_per_s(path):
    gc.collect()
    e = Engine(path, 1)
    heap = e.heap_bytes
    one = [1]
    n = 0
    t0 = ticks_us()
    while n < e.n_ctx - 1:
        e.forward(one, n)
        one[0] = e.argmax(0)
        n += 1
        if ticks_diff(ticks_us(), t0) >= BUDGET_US:
            break
    dt = ticks_diff(ticks_us(), t0)
    gc.collect()
    gc.disable()
    b0 = gc.mem_alloc()
    e.forward(one, n)
    transient = gc.mem_alloc() - b0
    gc.enable()
    return {"tok_per_s": n / dt * 1e6, "tokens": n, "heap_bytes": heap, "transient_bytes_per_token": transient}


out = {"macs": macs(), "drafter": tokens_per_s(sys.argv[1])}
gc.collect()
out["target"] = tokens_per_s(sys.argv[2])
gc.collect()
out["verify"] = verify_cost(sys.argv[2])
print(json.dumps(out))
