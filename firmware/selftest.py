"""The kernels' self-test: every kernel of a kernel module run on fixed inputs, a checksum of its outputs
compared with CHECKS, refkernels.py's (the reference) outputs, stored here: tests/test_kernelpick.py
recomputes them from refkernels and runs them against the viper and native kernels.

A few hundred bytes of buffers, allocated by `run` and dropped after it; the node imports this module only
while it picks its kernels (firmware/kernelpick.py), then forgets it. The inputs cover every branch of the
arithmetic the engine uses: matmul's groups of 1..5 positions and a strided pass of 7, on rows of 7 columns
(unrolled columns and the remainder) and of 8 (the Xtensa module's MAC16 loops), shifts on both sides of
mulsh's 16 and 1, left shifts, rows that need no shift, ties.
No bignum anywhere (32-bit boards): the inputs come from a closed formula, the checksum is Fletcher's
modulo 16381 on 16-bit halves.
"""

from array import array

from shared import intmath

# kernel name -> checksum of refkernels' outputs on the inputs below (tests/test_kernelpick.py recomputes them)
CHECKS = {"matmul": 163125015, "quant": 153958325, "requant": 235862421, "embed": 238621218, "rmsnorm": 213249293,
          "rope": 258969219, "attend": 251601808, "silu": 75901860, "argmax": 1}


def _fill(buf, n, lo, hi, c, o=0):
    """buf[o:o+n] = a fixed sequence of ints in [lo, hi]."""
    span = hi - lo + 1
    for i in range(n):
        buf[o + i] = lo + (i * i * 7919 + i * 104729 + c * 3571) % span


def _sum(h, a, o, n):
    """Fletcher checksum h (s2 << 14 | s1, mod 16381) extended by a[o:o+n]."""
    s1 = h & 0x3FFF
    s2 = h >> 14
    for i in range(o, o + n):
        v = a[i]
        s1 = (s1 + (v & 0xFFFF) + ((v >> 16) & 0xFFFF) * 3) % 16381
        s2 = (s2 + s1) % 16381
    return s2 << 14 | s1


def _set(p, *vals):
    for i in range(len(vals)):
        p[i] = vals[i]


def _matmul(K):
    rows = 3
    w = bytearray(4 * 8)
    _fill(w, 4 * 8, 0, 255, 1)
    x = array("i", range(7 * 8 + 1))
    p = array("i", range(16 + 7 * rows))
    h = 0
    for cols in (7, 8):  # 8: the rows of a multiple of 4 columns that the Xtensa module runs on MAC16
        for k in (1, 2, 3, 4, 5, 7):
            _fill(x, k * cols + 1, -32767, 32767, k)
            _set(p, rows, cols, k, 1)
            K.matmul(w, x, 0, p)
            h = _sum(h, p, 16, k * rows)
    return h


def _quant(K):
    src = array("i", range(24))
    _fill(src, 16, -(1 << 22), 1 << 22, 3)
    _fill(src, 8, -100, 100, 4, 16)  # a row that needs no shift
    dst = array("i", range(25))
    p = array("i", range(11))
    _set(p, 0, 8, 0, 15, 3, 3, 1)  # matmul's input: 3 rows of 8, interleaved
    K.quant(dst, src, p)
    h = _sum(_sum(0, dst, 0, 24), p, 8, 3)
    b = bytearray(22)
    _set(p, 2, 9, 1, 7, 1, 2, 10)  # KV-cache rows: 7 bits, values + 128, the shift after each row
    K.quant(b, src, p)
    return _sum(_sum(h, b, 0, 22), p, 8, 2)


def _requant(K):
    acc = array("i", range(12))
    _fill(acc, 6, -(1 << 30), 1 << 30, 5)
    _fill(acc, 6, -4096, 4096, 6, 6)
    ms = array("i", range(7))
    for r, s in enumerate((0, 47, 40, 31, 20, 16, 14)):
        ms[r] = 8192 + (r * 1237) % 8193 | s << 16
    dst = array("i", range(16))
    p = array("i", range(10))
    h = 0
    for add in (0, 1):
        _fill(dst, 16, -1000, 1000, 7)
        _set(p, 6, 2, 1, 8, 1, add, 0, 0, 0, 16)  # the second position's shift 16: s - 16 down to -2
        K.requant(dst, acc, ms, p)
        h = _sum(h, dst, 0, 16)
    return h


def _embed(K):
    w = bytearray(18)
    _fill(w, 18, 0, 255, 8)
    ms = array("i", (9000 | 20 << 16, 16384 | 36 << 16, 12000 | 14 << 16))
    dst = array("i", range(18))
    p = array("i", range(3))
    for t in range(3):
        _set(p, 6, t, 6 * t)
        K.embed(dst, w, ms, p)
    return _sum(0, dst, 0, 18)


def _rmsnorm(K):
    src = array("i", range(24))
    _fill(src, 8, -(1 << 22), 1 << 22, 9)
    _fill(src, 8, -300, 300, 10, 8)
    for i in range(16, 24):
        src[i] = 0
    wn = array("i", range(8))
    _fill(wn, 8, -16384, 16384, 11)
    dst = array("i", range(24))
    p = array("i", (8, 2, 13, 42950))
    K.rmsnorm(dst, src, wn, p)
    _set(p, 8, 1, 13, 0)  # a zero row without eps: zero output
    K.rmsnorm(memoryview(dst)[16:], memoryview(src)[16:], wn, p)
    return _sum(0, dst, 0, 24)


def _rope(K):
    buf = array("i", range(16))
    _fill(buf, 16, -(1 << 22), 1 << 22, 12)
    cs = array("h", range(136))
    _fill(cs, 136, -16384, 16384, 13)
    K.rope(buf, cs, array("i", (2, 2, 2, 31)))  # positions 31 and 32: both halves of the table move
    return _sum(0, buf, 0, 16)


def _attend(K):
    kv = bytearray(40)
    _fill(kv, 40, 0, 255, 14)
    for t in range(8):  # each row's shift in its last byte
        kv[t * 5 + 4] = (t * 5) % 7
    q = array("i", range(16))
    _fill(q, 16, -(1 << 20), 1 << 20, 15)
    sc = array("i", range(8 + intmath.EXP_SIZE))
    intmath.exp_table(memoryview(sc)[8:])
    K.attend(q, kv, sc, array("i", (3, 4, 5, 0, 20, 2, 2, 8192, 2, 4, 8)))
    return _sum(0, q, 0, 16)


def _silu(K):
    h1 = array("i", range(10))
    _fill(h1, 10, -(1 << 20), 1 << 20, 16)
    h3 = array("i", range(10))
    _fill(h3, 5, -(1 << 22), 1 << 22, 17)
    _fill(h3, 5, -1000, 1000, 18, 5)
    tab = array("i", range(intmath.EXP_SIZE))
    intmath.exp_table(tab)
    K.silu(h1, h3, tab, array("i", (5, 2)))
    return _sum(0, h1, 0, 10)


def _argmax(K):
    a = array("i", (9, -5, 7, 3, 7, -8, 2, 7, 100))
    return K.argmax(a, array("i", (1, 7)))  # 7 at 1 and 3 (from off): the first


TESTS = (("matmul", _matmul), ("quant", _quant), ("requant", _requant), ("embed", _embed),
         ("rmsnorm", _rmsnorm), ("rope", _rope), ("attend", _attend), ("silu", _silu), ("argmax", _argmax))


def checksums(K):
    """kernel name -> checksum of its outputs, for the kernel module K."""
    return {name: fn(K) for name, fn in TESTS}


def run(K):
    """The name of the first kernel of K whose outputs are not the reference's (or that raises), else None."""
    for name, fn in TESTS:
        try:
            if fn(K) != CHECKS[name]:
                return name
        except Exception:  # noqa: BLE001 - a kernel that raises fails its check
            return name
    return None
