"""`specmesh bench`'s board script (MicroPython code): times, on a board that holds the node, its own kernels
on the target's shapes, a strided read of a large buffer (the PSRAM stream rate) and of a model on its ROMFS
(the memory-mapped flash rate), and a whole greedy token of the model its node runs (specmesh.json's; a pipeline
stage's pass of its layers) where it fits its heap, once through the real kernels and once through stubs that return
at once (the engine's own interpreted work).

host/projection/boardbench.py sends this file over the raw REPL with host/projection/mpy/timing.py's text in
place of the `timing` import and a call of `main` appended, and reads the one JSON line it prints:
microseconds per call for each measurement.
"""

import gc
import json
from array import array

import kernels
from shared import intmath
from shared.modelfile import HEADER_SIZE
from timing import best, greedy_step


def arr(code, n, mod, off):
    a = array(code, range(n))
    for i in range(n):
        a[i] = (i * 7919 + 13) % mod - off
    return a


class Stubs:
    # the kernels' argument lists, returning at once: a token through them is the engine's own work
    # (a viper entry converts any ptr8/16/32 argument the same way, through the buffer protocol)
    pass


@micropython.viper  # noqa: F821 - the MicroPython compiler's decorator
def _ptr_ptr_int_ptr(a: ptr8, b: ptr8, c: int, d: ptr8):
    pass


@micropython.viper  # noqa: F821
def _ptr4(a: ptr8, b: ptr8, c: ptr8, d: ptr8):
    pass


@micropython.viper  # noqa: F821
def _ptr3(a: ptr8, b: ptr8, c: ptr8):
    pass


@micropython.viper  # noqa: F821
def _ptr2_int(a: ptr8, b: ptr8) -> int:
    return 0


def stubs():
    s = Stubs()
    s.matmul, s.argmax = _ptr_ptr_int_ptr, _ptr2_int
    s.quant = s.rope = _ptr3
    s.requant = s.embed = s.rmsnorm = s.attend = s.silu = _ptr4
    return s


@micropython.viper  # noqa: F821
def stride_read(b: ptr8, n: int) -> int:
    s = 0
    i = 0
    while i < n:
        s += b[i]
        i += 32
    return s


def time_kernels(out, reps, shapes, theta):
    """Each kernel once on the shapes (dim, hidden, heads, kv heads, head dim, context, vocab)."""
    D, H, NH, NKV, HD, CTX, V = shapes
    w = bytearray(i * 37 % 251 for i in range(H * D))
    for k in (1, 5):
        x = arr('i', k * D + 1, 65535, 32767)
        p = arr('i', 16 + k * D, 1, 0)
        p[0], p[1], p[2], p[3] = D, D, k, 0
        out['matmul_%d' % k] = best(kernels.matmul, (w, x, 0, p), reps)
    src = arr('i', H, 1 << 20, 1 << 19)
    dst = arr('i', H + 1, 1, 0)
    pr = arr('i', 9, 1, 0)
    pr[1], pr[3], pr[4], pr[5], pr[6] = D, 15, 1, 1, 1
    out['quant'] = best(kernels.quant, (dst, src, pr), reps)
    ms = arr('i', D, 1, 0)
    for r in range(D):
        ms[r] = 9000 | 20 << 16
    pr[0], pr[1], pr[2], pr[3], pr[4], pr[5] = D, 1, 0, D, 0, 0
    out['requant'] = best(kernels.requant, (dst, src, ms, pr), reps)
    wn = arr('i', D, 1 << 16, 0)
    pn = array('i', [D, 1, 16, 1 << 10])
    xn = arr('i', D, 1, 0)
    out['rmsnorm'] = best(kernels.rmsnorm, (xn, src, wn, pn), reps)
    cs = intmath.rope_table(theta, HD, CTX, array('h', range(intmath.rope_size(HD, CTX))))
    q = arr('i', NH * HD, 1 << 18, 1 << 17)
    po = array('i', [1, NH, HD // 2, CTX - 1])
    out['rope'] = best(kernels.rope, (q, cs, po), reps)
    stride = NKV * HD + 1
    kv = bytearray((i * 31 + 5) % 200 for i in range(2 * CTX * stride))
    for t in range(2 * CTX):
        kv[t * stride + stride - 1] = 9
    sc = arr('i', CTX + HD + intmath.EXP_SIZE, 1, 0)
    intmath.exp_table(memoryview(sc)[CTX + HD:])
    pa = array('i', [CTX, HD, stride, 0, CTX * stride, NH, NH // NKV, 5793, 1, CTX, CTX + HD])
    out['attend'] = best(kernels.attend, (q, kv, sc, pa), reps)
    h1, h3 = arr('i', H, 1 << 18, 1 << 17), arr('i', H, 1 << 18, 1 << 17)
    out['silu'] = best(kernels.silu, (h1, h3, memoryview(sc)[CTX + HD:], array('i', [H, 1])), reps)
    logits = arr('i', V, 1 << 20, 1 << 19)
    out['argmax'] = best(kernels.argmax, (logits, array('i', [0, V])), reps)


def time_memory(out, reps, stream, paths):
    """The stream rate of a large heap buffer, and of a model's ROMFS file when the board has one."""
    gc.collect()
    n = min(stream, gc.mem_free() // 4) // 32 * 32  # a quarter: the free heap is fragmented
    big = None
    while big is None:
        try:
            big = bytearray(n)
        except MemoryError:  # no free block that long (a classic ESP32's heap after this script's code): half
            if n < 4096:
                raise
            n = n // 64 * 32
    out['stream'] = [n, best(stride_read, (big, n), reps)]
    del big
    gc.collect()
    for path in paths.values():
        if path and path.startswith('/rom/'):
            with open(path, 'rb') as f:
                mv = memoryview(f)
                n = len(mv) // 32 * 32
                out['flash'] = [n, best(stride_read, (mv, n), reps)]
            del mv


def config():
    # the board config the node runs (specmesh.json), {} where none reads as one
    try:
        with open('specmesh.json') as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return {}
    return cfg if isinstance(cfg, dict) else {}


def models(cfg):
    # {'drafter', 'target' or 'stage': path} of the model the board's node runs, as its config names it: a classic
    # ESP32's drafter is models/drafter-esp32.spm, a model on a ROMFS /rom/<its name>; {} for none
    name = {'drafter': 'drafter', 'verifier': 'target', 'stage': 'stage'}.get(cfg.get('role'))
    model = cfg.get('model')
    return {name: model} if name and isinstance(model, str) and model else {}


def time_token(out, reps, name, path):
    """A greedy token at position 32 (and for the target a verify of 5), then the same through the stubs."""
    from engine import Engine

    gc.collect()
    try:
        e = Engine(path, 5 if name == 'target' else 1, native=False)  # the viper kernels timed above
    except MemoryError:
        out[name] = 'no heap'
        return
    step = greedy_step(e)
    with open(path, 'rb') as f:
        hd = f.read(HEADER_SIZE)
    token = best(step, (), reps)
    if name == 'target':
        five = [1, 2, 3, 4, 5]

        def verify():
            e.forward(five, 32)
            e.rollback(32)

        out['target_verify5'] = best(verify, (), reps)
    kern, e.kern = e.kern, stubs()
    out[name] = [token, list(hd), best(step, (), reps)]
    e.kern = kern


def time_stage(out, reps, path, layers, n_ctx):
    """A pipeline stage's pass of one position at position 32 through its layers [a, b) (on the last stage
    without the classifier: the pass of every position it does not judge), then the same through the stubs.
    Each pass starts from the same input: the first stage's token, a later stage's rows restored."""
    from stage_engine import StageEngine

    gc.collect()
    try:
        e = StageEngine(path, layers, 1, True, n_ctx, False)  # the viper kernels timed above
    except MemoryError:
        out['stage'] = 'no heap'
        return
    first = e.a == 0
    dim = e.header.dim
    rows = arr('i', dim, 1 << 16, 1 << 15)  # a later stage's input: one position's residual row
    for i in range(32):
        if not first:
            e.x[:dim] = rows
        e.forward([(7 * i + 3) % e.vocab] if first else None, i, 1, False)

    def step():
        if not first:
            e.x[:dim] = rows
        e.forward([1] if first else None, 32, 1, False)
        e.rollback(32)
    with open(path, 'rb') as f:
        hd = f.read(HEADER_SIZE)
    us = best(step, (), reps)
    kern, e.kern = e.kern, stubs()
    out['stage'] = [us, list(hd), best(step, (), reps), [e.a, e.b]]
    e.kern = kern


def main(reps, shapes, stream, theta):
    out = {}
    time_kernels(out, reps, shapes, theta)
    gc.collect()
    cfg = config()
    paths = models(cfg)
    time_memory(out, reps, stream, paths)
    for name, path in paths.items():
        if name == 'stage':
            time_stage(out, reps, path, cfg.get('layers'), cfg.get('n_ctx', 0))
        else:
            time_token(out, reps, name, path)
        gc.collect()
    return json.dumps(out)
