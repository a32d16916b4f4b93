"""The engine's kernels in plain Python: the reference for kernels.py (same signatures, same integers) and
the fallback on ports without a native emitter. int8 weights are bytearrays (sign-extended here), the KV
cache's int8 values are stored + 128,
int32 ones array('i'); `quant` with bits > 7 writes int32 (matmul's input, positions interleaved).
"""

from shared.intmath import expq, inv_rms, mulsh, rope_at, rshr, sigmoid_q14


def _s8(b):
    return (b ^ 128) - 128


def _shift(src, o, n, bits):
    """The least shift that fits max |src[o:o+n]| in `bits` bits."""
    m = 0
    for i in range(o, o + n):
        m = max(m, abs(src[i]))
    sh = 0
    while (m >> sh) >> bits:
        sh += 1
    return sh


def matmul(w, x, a, p):
    rows, cols, k, r0 = p[0], p[1], p[2], p[3]
    for j in range(k):
        for r in range(rows):
            wo = (r0 + r) * cols
            a = 0
            for c in range(cols):
                a += _s8(w[wo + c]) * x[c * k + j]
            p[16 + j * rows + r] = a


def quant(dst, src, p):
    n, bits, stride = p[1], p[3], p[4]
    lim = (1 << bits) - 1
    for j in range(p[5]):
        so = p[0] + j * n
        do = p[2] + j * p[6]
        sh = _shift(src, so, n, bits)
        for i in range(n):
            v = min(lim, max(-lim, rshr(src[so + i], sh)))
            dst[do + i * stride] = v + 128 if bits <= 7 else v
        if bits <= 7:
            dst[do + n * stride] = sh
        p[8 + j] = sh


def requant(dst, acc, ms, p):
    n, k, r0, stride, d0, add = p[0], p[1], p[2], p[3], p[4], p[5]
    for j in range(k):
        for r in range(n):
            v = ms[r0 + r]
            y = mulsh(acc[j * n + r], v & 0xFFFF, (v >> 16) - p[8 + j])
            o = j * stride + d0 + r
            dst[o] = dst[o] + y if add else y


def embed(dst, w, ms, p):
    dim, t, d0 = p[0], p[1], p[2]
    for i in range(dim):
        dst[d0 + i] = mulsh(_s8(w[t * dim + i]), ms[t] & 0xFFFF, (ms[t] >> 16) - 16)


def rmsnorm(dst, src, wn, p):
    dim, qw, eps = p[0], p[2], p[3]
    for j in range(p[1]):
        o = j * dim
        sh = _shift(src, o, dim, 10)
        ss = 0
        for i in range(o, o + dim):
            ss += (src[i] >> sh) * (src[i] >> sh)
        g, s = inv_rms(ss, dim, eps, sh)
        for i in range(dim):
            dst[o + i] = mulsh(mulsh(src[o + i], wn[i], qw), g, s)


def rope(buf, cs, p):
    k, heads, half, pos0 = p[0], p[1], p[2], p[3]
    for j in range(k):
        for i in range(half):
            c, s = rope_at(cs, 2 * half, pos0 + j, i)
            for h in range(heads):
                o = (j * heads + h) * 2 * half + 2 * i
                a, b = buf[o], buf[o + 1]
                buf[o] = mulsh(a, c, 14) - mulsh(b, s, 14)
                buf[o + 1] = mulsh(a, s, 14) + mulsh(b, c, 14)


def attend(q, kv, sc, p):
    hd, stride, kb, vb, heads, group, isq, qq, tab = p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[9], p[10]
    for jh in range(p[8] * heads):
        n, h = p[0] + jh // heads, jh % heads
        qo = jh * hd
        kh = (h // group) * hd
        sh = _shift(q, qo, hd, 15)
        for i in range(hd):
            sc[qq + i] = min(32767, max(-32767, rshr(q[qo + i], sh)))
        mx = 0
        for t in range(n):
            b = kb + t * stride
            a = 0
            for i in range(hd):
                a += sc[qq + i] * (kv[b + kh + i] - 128)
            a = mulsh(a, isq, 34 - sh - kv[b + stride - 1])
            sc[t] = a
            if t == 0 or a > mx:
                mx = a
        z = vm = 0
        for t in range(n):
            sc[t] = expq(mx - sc[t], memoryview(sc)[tab:])
            z += sc[t]
            vm = max(vm, kv[vb + t * stride + stride - 1])
        rz = (1 << 30) // z
        for i in range(hd):
            q[qo + i] = 0
        for t in range(n):
            b = vb + t * stride
            s = 8 + vm - kv[b + stride - 1]
            a = rshr(sc[t] * rz, s) if s <= 30 else 0
            for i in range(hd):
                q[qo + i] += a * (kv[b + kh + i] - 128)
        for i in range(qo, qo + hd):
            q[i] = rshr(q[i], 22 - vm)


def silu(h1, h3, tab, p):
    n = p[0]
    for j in range(p[1]):
        o = j * n
        sh = _shift(h3, o, n, 14)
        for i in range(o, o + n):
            a = h1[i]
            b = min(16383, max(-16383, rshr(h3[i], sh)))
            h1[i] = mulsh(mulsh(a, sigmoid_q14(a, tab), 14), b, 16 - sh)


def argmax(a, p):
    off = p[0]
    best = 0
    for i in range(1, p[1]):
        if a[off + i] > a[off + best]:
            best = i
    return best
