"""`specmesh bench --port PORT`: measure host/projection/costmodel.py's terms on a flashed board, write a calibration.

The board must hold the node (`specmesh flash`): the script below, run over mpremote's raw REPL,
imports the board's own kernels and engine and times, best of several calls (ticks_us), each kernel on
the shipped target's shapes (matmul over 1 and 5 positions, quant and requant, RMSNorm, RoPE,
attention, SiLU, argmax), a strided read of a large buffer (the PSRAM stream rate) and of a model on its
ROMFS (the memory-mapped flash rate), and a whole greedy token of each model the board holds that fits its
heap. The host divides each time by the work host/projection/costmodel.py counts for the same call, giving
seconds per unit for each term. The interpreted calls between kernels (`engine`) are timed on their own:
the same token again with the engine's kernels swapped for viper functions of the same signatures that
return at once. So every term is measured, and whole tokens and a 5-position verify are checks: measured
next to what the rates project. The board is soft-reset back into its node afterwards.
"""

from __future__ import annotations

import contextlib
import json

from host.projection import costmodel as cm
from host.projection.calibration import write
from host.provision.flash import FlashError, open_board, probe
from shared.modelfile import HEADER_SIZE, Header, parse_header

# The target's shapes (stories260K): what the calibrated rates are measured on.
DIM, HIDDEN, HEADS, KV_HEADS, HD, CTX, VOCAB = 64, 172, 8, 4, 8, 40, 512
EXEC_TIMEOUT_S = 120  # longest silence from the board while the script runs
STREAM_BYTES = 256 * 1024  # larger than any data cache: every 32-byte line is a miss on a board

BOARD_SCRIPT = """
import gc, json
from array import array
from time import ticks_us, ticks_diff
import kernels
from shared import intmath
from shared.modelfile import HEADER_SIZE

def best(fn, *a):
    # microseconds per call: the fastest of %(reps)d timings of n calls, n doubled until one takes 2 ms
    fn(*a)
    n = 1
    while True:
        t = ticks_us()
        for _ in range(n):
            fn(*a)
        if ticks_diff(ticks_us(), t) >= 2000:
            break
        n *= 2
    b = 1 << 30
    for _ in range(%(reps)d):
        t = ticks_us()
        for _ in range(n):
            fn(*a)
        b = min(b, ticks_diff(ticks_us(), t))
    return b / n

def arr(code, n, mod, off):
    a = array(code, range(n))
    for i in range(n):
        a[i] = (i * 7919 + 13) %% mod - off
    return a

class Stubs:
    # the kernels' argument lists, returning at once: a token through them is the engine's own work
    # (a viper entry converts any ptr8/16/32 argument the same way, through the buffer protocol)
    pass

@micropython.viper
def _ptr_ptr_int_ptr(a: ptr8, b: ptr8, c: int, d: ptr8):
    pass

@micropython.viper
def _ptr4(a: ptr8, b: ptr8, c: ptr8, d: ptr8):
    pass

@micropython.viper
def _ptr3(a: ptr8, b: ptr8, c: ptr8):
    pass

@micropython.viper
def _ptr2_int(a: ptr8, b: ptr8) -> int:
    return 0

stubs = Stubs()
stubs.matmul, stubs.argmax = _ptr_ptr_int_ptr, _ptr2_int
stubs.quant = stubs.rope = _ptr3
stubs.requant = stubs.embed = stubs.rmsnorm = stubs.attend = stubs.silu = _ptr4

@micropython.viper
def stride_read(b: ptr8, n: int) -> int:
    s = 0
    i = 0
    while i < n:
        s += b[i]
        i += 32
    return s

D, H, NH, NKV, HD, CTX, V = %(shapes)s
out = {}
w = bytearray(i * 37 %% 251 for i in range(H * D))
for k in (1, 5):
    x = arr('i', k * D + 1, 65535, 32767)
    p = arr('i', 16 + k * D, 1, 0)
    p[0], p[1], p[2], p[3] = D, D, k, 0
    out['matmul_%%d' %% k] = best(kernels.matmul, w, x, 0, p)
src = arr('i', H, 1 << 20, 1 << 19)
dst = arr('i', H + 1, 1, 0)
pr = arr('i', 9, 1, 0)
pr[1], pr[3], pr[4], pr[5], pr[6] = D, 15, 1, 1, 1
out['quant'] = best(kernels.quant, dst, src, pr)
ms = arr('i', D, 1, 0)
for r in range(D):
    ms[r] = 9000 | 20 << 16
pr[0], pr[1], pr[2], pr[3], pr[4], pr[5] = D, 1, 0, D, 0, 0
out['requant'] = best(kernels.requant, dst, src, ms, pr)
wn = arr('i', D, 1 << 16, 0)
pn = array('i', [D, 1, 16, 1 << 10])
xn = arr('i', D, 1, 0)
out['rmsnorm'] = best(kernels.rmsnorm, xn, src, wn, pn)
cs = intmath.rope_table(%(theta)d, HD, CTX, array('h', range(intmath.rope_size(HD, CTX))))
q = arr('i', NH * HD, 1 << 18, 1 << 17)
po = array('i', [1, NH, HD // 2, CTX - 1])
out['rope'] = best(kernels.rope, q, cs, po)
stride = NKV * HD + 1
kv = bytearray((i * 31 + 5) %% 200 for i in range(2 * CTX * stride))
for t in range(2 * CTX):
    kv[t * stride + stride - 1] = 9
sc = arr('i', CTX + HD + intmath.EXP_SIZE, 1, 0)
intmath.exp_table(memoryview(sc)[CTX + HD:])
pa = array('i', [CTX, HD, stride, 0, CTX * stride, NH, NH // NKV, 5793, 1, CTX, CTX + HD])
out['attend'] = best(kernels.attend, q, kv, sc, pa)
h1, h3 = arr('i', H, 1 << 18, 1 << 17), arr('i', H, 1 << 18, 1 << 17)
out['silu'] = best(kernels.silu, h1, h3, memoryview(sc)[CTX + HD:], array('i', [H, 1]))
logits = arr('i', V, 1 << 20, 1 << 19)
out['argmax'] = best(kernels.argmax, logits, array('i', [0, V]))
del w, x, p, src, dst, kv, logits
gc.collect()
n = min(%(stream)d, gc.mem_free() // 4) // 32 * 32  # a quarter: the free heap is fragmented
big = bytearray(n)
out['stream'] = [n, best(stride_read, big, n)]
del big
gc.collect()

def where(name):
    # a model on the board's ROMFS (read in place from flash), else on its filesystem
    for path in ('/rom/%%s.spm' %% name, 'models/%%s.spm' %% name):
        try:
            open(path).close()
            return path
        except OSError:
            pass

paths = {name: where(name) for name in ('drafter', 'target')}
for path in paths.values():
    if path and path.startswith('/rom/'):
        with open(path, 'rb') as f:
            mv = memoryview(f)
            n = len(mv) // 32 * 32
            out['flash'] = [n, best(stride_read, mv, n)]
        del mv
from engine import Engine
for name, path in paths.items():
    if path is None:
        continue
    gc.collect()
    try:
        e = Engine(path, 5 if name == 'target' else 1, native=False)  # the viper kernels timed above
    except MemoryError:
        out[name] = 'no heap'
        continue
    for i in range(32):
        e.forward([(7 * i + 3) %% e.vocab], i)
    one = [1]
    def step():
        e.forward(one, 32)
        one[0] = e.argmax(0)
        e.rollback(32)
    with open(path, 'rb') as f:
        hd = f.read(HEADER_SIZE)
    token = best(step)
    if name == 'target':
        five = [1, 2, 3, 4, 5]
        def verify():
            e.forward(five, 32)
            e.rollback(32)
        out['target_verify5'] = best(verify)
    kern, e._k = e._k, stubs
    out[name] = [token, list(hd), best(step)]
    e._k = kern
    del e
    gc.collect()
print(json.dumps(out))
"""


def script(reps: int = 7) -> str:
    return BOARD_SCRIPT % {"reps": reps, "shapes": (DIM, HIDDEN, HEADS, KV_HEADS, HD, CTX, VOCAB),
                           "stream": STREAM_BYTES, "theta": _shape().rope_theta_bits}


def _shape() -> Header:
    """A model header with the micro-benchmarks' shapes, for counting their work."""
    return Header(DIM, 1, HEADS, KV_HEADS, HIDDEN, VOCAB, CTX)


def modeled() -> dict[str, cm.Work]:
    """The work host/projection/costmodel.py counts for each micro-benchmark of the board script."""
    h = _shape()
    out = {}
    for k in (1, 5):
        out["matmul_%d" % k] = w = cm.Work()
        cm.VIPER.matmul(w, DIM, DIM, k)
    out["quant"] = w = cm.Work()
    cm.VIPER.quant(w, 1, DIM)
    out["requant"] = w = cm.Work()
    cm.VIPER.requant(w, DIM, 1)
    out["rmsnorm"] = w = cm.Work()
    cm.VIPER.rmsnorm(w, DIM, 1)
    out["rope"] = w = cm.Work()
    cm.VIPER.rope(w, h, HEADS, 1)
    out["attend"] = w = cm.Work()
    cm.VIPER.attend(w, h, 1, CTX)
    out["silu"] = w = cm.Work()
    cm.VIPER.silu(w, HIDDEN, 1)
    out["argmax"] = cm.Work(embed_argmax=VOCAB * cm.loop_insns("argmax", 0))
    return out


def rates(measured: dict) -> tuple[dict[str, float], dict]:
    """(seconds per unit of each term, the whole-token check) from the board script's microseconds."""
    work = modeled()

    def per_unit(*names: str) -> float:
        us = sum(measured[n] for n in names)
        units = sum(sum(work[n].values()) for n in names)
        return us * 1e-6 / units

    s = {"matmul_1": per_unit("matmul_1"), "matmul_5": per_unit("matmul_5")}
    s["requant"] = s["residual"] = per_unit("quant", "requant")
    for t in ("rmsnorm", "rope", "silu"):
        s[t] = per_unit(t)
    s["softmax"] = s["kv_reads"] = per_unit("attend")  # one kernel: its rate covers both terms
    s["embed_argmax"] = per_unit("argmax")
    n, us = measured["stream"]
    s["weights_psram"] = s["kv_psram"] = us * 1e-6 / n
    if "flash" in measured:  # a model on the board's ROMFS: memory-mapped flash read the same way
        n, us = measured["flash"]
        s["weights_flash"] = us * 1e-6 / n
    check: dict = {}
    heads = {}
    for name in ("drafter", "target"):
        token = measured.get(name)
        if isinstance(token, list):  # [microseconds, header bytes, microseconds through the stubs]
            heads[name] = h = parse_header(bytes(token[1][:HEADER_SIZE]))
            token[1] = "%d layers x %d dim, vocab %d" % (h.n_layers, h.dim, h.vocab)
    timed = "target" if "target" in heads else "drafter"
    if heads:  # the interpreted calls between kernels: a token whose kernels return at once
        w = cm.pass_work(heads[timed], 1, 33)
        s["engine"] = measured[timed][2] * 1e-6 / w["engine"]
        check["interpreted calls between kernels, share of the %s token" % timed] = (
            measured[timed][2] / measured[timed][0])
    # whole passes, measured next to what the rates project
    for label, name, k, ctx in (("drafter token", "drafter", 1, 33), ("target token", "target", 1, 33),
                                ("target verify of 5", "target", 5, 37)):
        us = measured.get("target_verify5" if k == 5 else name)
        if name in heads and us is not None:
            us = us if k == 5 else us[0]
            w = cm.pass_work(heads[name], k, ctx)
            check[label] = {"measured_us": us, "projected_us": 1e6 * sum(v * s[t] for t, v in w.items())}
    return s, check


def bench(port: str, out: str, reps: int = 7) -> dict:
    """Run the micro-benchmarks on the board at `port`, write the calibration to `out`. FlashError."""
    from mpremote.transport import TransportError

    transport = open_board(port)
    try:
        info = probe(transport)
        if not transport.fs_exists("kernels.mpy") and not transport.fs_exists("kernels.py"):
            raise FlashError("%s has no specmesh node: flash it first (specmesh flash --port %s --role verifier)"
                             % (port, port))
        try:  # a real board takes seconds per model (loading, 32 tokens of prefix): a generous silence limit
            raw, err = transport.exec_raw(script(reps), timeout=EXEC_TIMEOUT_S)
        except TransportError as e:
            raise FlashError("lost the board during the benchmark: %s" % e) from None
        lines = (err or raw).decode(errors="replace").strip().splitlines()
        if err or not lines:
            raise FlashError("the benchmark failed on the board: %s" % (lines[-1] if lines else "no output"))
        try:
            measured = json.loads(lines[-1])
        except ValueError:
            raise FlashError("the board's answer is not the benchmark's JSON: %s" % lines[-1][:80]) from None
    finally:
        with contextlib.suppress(Exception):
            transport.exit_raw_repl()
            transport.serial.write(b"\x04")  # soft reset: main.py starts the node again
        transport.close()
    s, check = rates(measured)
    board = {"machine": info.machine or info.platform, "platform": info.platform, "arch": info.arch,
             "micropython": ".".join(map(str, info.version[:3])), "port": port}
    write(out, board, s, measured, check)
    return {"board": board, "seconds_per_unit": s, "measured": measured, "check": check}


def report(result: dict, out: str) -> list[str]:
    """Lines for the user: each term's rate next to the derived one, and the whole-token check."""
    from host.projection.calibration import Rates
    from host.projection.hardware import ESP32S3

    derived = Rates.derived(ESP32S3).seconds
    lines = ["calibration of %s (%s, MicroPython %s) written to %s" % (
        result["board"]["port"], result["board"]["machine"], result["board"]["micropython"], out),
        "%-14s %14s %14s" % ("term", "measured", "derived S3")]
    for t, v in result["seconds_per_unit"].items():
        unit = "s/insn" if t in cm.COMPUTE else "s/call" if t == "engine" else "s/byte"  # costmodel's units
        lines.append("%-14s %10.3g %-6s %10.3g" % (t, v, unit, derived[t]))
    for label, c in result["check"].items():
        if isinstance(c, dict):
            lines.append("%s: measured %.0f us, projected with these rates %.0f us (%+.0f%%)" % (
                label, c["measured_us"], c["projected_us"], 100 * (c["projected_us"] / c["measured_us"] - 1)))
        else:
            lines.append("%s: %.0f%%" % (label, 100 * c))
    return lines
