"""Viper kernels of the firmware engine: every per-element step of the integer model arithmetic.

docs/CONTRACTS.md section 4 defines the arithmetic; `refkernels.py` is the same kernels in plain Python
(the reference, and the fallback on ports without a native emitter), with identical results. Compiled by
MicroPython's viper emitter (x64 on the unix port, xtensawin on ESP32 and ESP32-S3). Every kernel takes
buffers and `p`, an array('i') of sizes, offsets and scalars (results come back in `p` or as a small
int), so a call allocates nothing.

32- and 64-bit emitters compute the same: loads are sign-extended by hand (`ptr32` loads are not
sign-extended on x64), only small constants appear, and every intermediate value stays inside int32 for
the shapes the engine accepts (see engine.py). No shift count reaches 31 where a scale's exponent sets it
(32-bit cores shift by the count's low 5 bits, x64 by its low 6): a rounding shift of 46 or more gives
0, as kernels.c's mulsh does (|a * m| < 2^45), and a left shift of 32 or more gives 0, the exact value
modulo 2^32. `mulsh(a, m, s) = round(a * m / 2^s)` (|a| < 2^31,
|m| <= 2^14) is written out where it is used, splitting a into a >> 15 and a & 0x7FFF so that no
product leaves int32; viper cannot inline a call, and a call per element would cost more than the step.
"""

import micropython


@micropython.viper
def matmul(wp: ptr8, xp: ptr32, a: int, p: ptr32):
    """p[16 + j*rows + r] = sum_c int8 w[(r0 + r)*cols + c] * x[c*k + j] for r < rows, j < k, where wp
    is w and xp is x: int32 inputs, the k positions interleaved. p = (rows, cols, k, r0, ...).

    Written for viper's register locals: the inner loop walks the two pointers, the parameters wp and
    xp, which viper keeps in registers (pass 0 for a, the running sum); sums are written `a = v * x + a`,
    which mpy-cross compiles with fewer stack round trips than `a += v * x` (tools/xtensa_loops.py). x is read as 32-bit words
    and never sign-extended: on a 64-bit emitter a negative x loads as x + 2^32, which changes no sum
    modulo 2^32, and sums are stored as 32 bits. Each weight byte is loaded once per group of up to
    5 positions (a verify of gamma = 4 is one group; groups of 1 and of 4 or 5 have loops of their
    own, 2 and 3 share one); the group's other sums live on the stack. x needs one word of slack
    after its k * cols values (a group of 4 at the end reads it and drops the product).
    """
    rows = p[0]
    cols = p[1]
    k = p[2]
    wb = uint(wp) + p[3] * cols
    xb = uint(xp)
    step = 4 * k
    for r in range(rows):
        j = 0
        while j < k:
            g = k - j
            if g > 5:
                g = 5
            wp = ptr8(wb + r * cols)
            xp = ptr32(xb + 4 * j)
            end = uint(wp) + cols
            a = 0
            if g == 1:
                while uint(wp) < end:
                    a = ((wp[0] ^ 0x80) - 0x80) * xp[0] + a
                    wp = ptr8(uint(wp) + 1)
                    xp = ptr32(uint(xp) + step)
            elif g >= 4:  # 4 positions run the 5-position loop: a4 reads the slack word past x, unused
                a1 = 0
                a2 = 0
                a3 = 0
                a4 = 0
                while uint(wp) < end:
                    v = (wp[0] ^ 0x80) - 0x80
                    a = v * xp[0] + a
                    a1 = v * xp[1] + a1
                    a2 = v * xp[2] + a2
                    a3 = v * xp[3] + a3
                    a4 = v * xp[4] + a4
                    wp = ptr8(uint(wp) + 1)
                    xp = ptr32(uint(xp) + step)
                p[16 + (j + 1) * rows + r] = a1
                p[16 + (j + 2) * rows + r] = a2
                p[16 + (j + 3) * rows + r] = a3
                if g == 5:
                    p[16 + (j + 4) * rows + r] = a4
            else:
                a1 = 0
                a2 = 0
                while uint(wp) < end:
                    v = (wp[0] ^ 0x80) - 0x80
                    a = v * xp[0] + a
                    a1 = v * xp[1] + a1
                    if g == 3:
                        a2 = v * xp[2] + a2
                    wp = ptr8(uint(wp) + 1)
                    xp = ptr32(uint(xp) + step)
                p[16 + (j + 1) * rows + r] = a1
                if g == 3:
                    p[16 + (j + 2) * rows + r] = a2
            p[16 + j * rows + r] = a
            j += g


@micropython.viper
def quant(dst: ptr8, src: ptr32, p: ptr32):
    """For each of `rows` rows j of n values at src[so + j*n]: dst[do + j*rstep + i*stride] =
    clip(round(src[.. + i] / 2^sh_j), +-(2^bits - 1)), sh_j the least shift that fits the row's max
    |x| in `bits` bits, and p[8 + j] = sh_j. bits <= 7: bytes holding the value + 128 (no sign to
    extend where they are read), sh_j also in the byte after the row (the KV cache's rows); else int32
    (matmul's input). p = (so, n, do, bits, stride, rows, rstep)."""
    n = p[1]
    bits = p[3]
    stride = p[4]
    lim = (1 << bits) - 1
    d32 = ptr32(dst)
    for j in range(p[5]):
        so = p[0] + j * n
        do = p[2] + j * p[6]
        m = 0
        for i in range(so, so + n):
            v = src[i]
            v = ((((v >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (v & 0xFFFF)
            if v < 0:
                v = 0 - v
            if v > m:
                m = v
        sh = 0
        while (m >> sh) >> bits:
            sh += 1
        half = (1 << sh) >> 1
        for i in range(n):
            v = src[so + i]
            v = ((((v >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (v & 0xFFFF)
            v = (v + half) >> sh
            if v > lim:
                v = lim
            elif v < 0 - lim:
                v = 0 - lim
            if bits <= 7:
                dst[do + i * stride] = v + 128
            else:
                d32[do + i * stride] = v
        if bits <= 7:
            dst[do + n * stride] = sh
        p[8 + j] = sh


@micropython.viper
def requant(dst: ptr32, acc: ptr32, ms: ptr32, p: ptr32):
    """dst[j*stride + d0 + r] (+ when add)= mulsh(acc[j*n + r], m, s - sh_j) for r < n, j < k, where
    ms[r0 + r] = m | s << 16; p = (n, k, r0, stride, d0, add, -, -, sh_0 .. sh_k-1): the shifts where
    `quant` left them."""
    n = p[0]
    k = p[1]
    r0 = p[2]
    stride = p[3]
    d0 = p[4]
    add = p[5]
    for j in range(k):
        sh = p[8 + j]
        for r in range(n):
            a = acc[j * n + r]
            a = ((((a >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (a & 0xFFFF)
            m = ms[r0 + r]
            s = ((((m >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) - sh
            m = m & 0xFFFF
            if s >= 46:
                y = 0
            elif s >= 16:
                y = ((a >> 15) * m + (1 << (s - 16)) + (((a & 0x7FFF) * m) >> 15)) >> (s - 15)
            elif s >= 1:
                y = (((a >> 15) * m) << (15 - s)) + ((((a & 0x7FFF) * m) + (1 << (s - 1))) >> s)
            elif s > -32:
                y = (a * m) << (0 - s)
            else:
                y = 0
            o = j * stride + d0 + r
            if add:
                v = dst[o]
                y += ((((v >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (v & 0xFFFF)
            dst[o] = y


@micropython.viper
def embed(dst: ptr32, w: ptr8, ms: ptr32, p: ptr32):
    """dst[d0 + i] = mulsh(int8 w[t*dim + i], m, s - 16) for i < dim (Q16), ms[t] = m | s << 16;
    p = (dim, t, d0)."""
    dim = p[0]
    t = p[1]
    d0 = p[2]
    m = ms[t] & 0xFFFF
    s = ((((ms[t] >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) - 16
    for i in range(dim):
        a = ((w[t * dim + i] ^ 0x80) - 0x80) * m
        if s >= 31:  # |a| < 2^21
            a = 0
        elif s >= 1:
            a = (a + (1 << (s - 1))) >> s
        elif s > -32:
            a = a << (0 - s)
        else:
            a = 0
        dst[d0 + i] = a


@micropython.viper
def rmsnorm(dst: ptr32, src: ptr32, wn: ptr32, p: ptr32):
    """dst row j = mulsh(mulsh(x_i, wn_i, qw), g, s) for the k rows of dim values of src, where
    (g, s) = intmath.inv_rms of the row's 10-bit sum of squares; p = (dim, k, qw, eps)."""
    dim = p[0]
    qw = p[2]
    for j in range(p[1]):
        o = j * dim
        m = 0
        for i in range(o, o + dim):
            v = src[i]
            v = ((((v >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (v & 0xFFFF)
            if v < 0:
                v = 0 - v
            if v > m:
                m = v
        sh = 0
        while (m >> sh) >> 10:
            sh += 1
        ss = 0
        for i in range(o, o + dim):
            v = src[i]
            v = (((((v >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (v & 0xFFFF)) >> sh
            ss += v * v
        t = ss // dim
        if 2 * sh <= 31:
            t += p[3] >> (2 * sh)
        if t <= 0:
            for i in range(o, o + dim):
                dst[i] = 0
            continue
        n = 0
        while t < (1 << 28):
            t = t << 2
            n += 1
        q = 32768  # isqrt(t), Newton from above: t < 2^30
        while True:
            y = (q + t // q) >> 1
            if y >= q:
                break
            q = y
        g = (1 << 28) // q
        s = 12 + sh - n
        for i in range(dim):
            a = src[o + i]
            a = ((((a >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (a & 0xFFFF)
            m = wn[i]
            m = ((((m >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (m & 0xFFFF)
            if qw >= 46:
                a = 0
            elif qw >= 16:
                a = ((a >> 15) * m + (1 << (qw - 16)) + (((a & 0x7FFF) * m) >> 15)) >> (qw - 15)
            elif qw >= 1:
                a = (((a >> 15) * m) << (15 - qw)) + ((((a & 0x7FFF) * m) + (1 << (qw - 1))) >> qw)
            elif qw > -32:
                a = (a * m) << (0 - qw)
            else:
                a = 0
            if s >= 16:
                a = ((a >> 15) * g + (1 << (s - 16)) + (((a & 0x7FFF) * g) >> 15)) >> (s - 15)
            elif s >= 1:
                a = (((a >> 15) * g) << (15 - s)) + ((((a & 0x7FFF) * g) + (1 << (s - 1))) >> s)
            else:
                a = (a * g) << (0 - s)
            dst[o + i] = a


@micropython.viper
def rope(buf: ptr32, cs: ptr16, p: ptr32):
    """Rotate each pair (2i, 2i+1) of every head of k rows of buf (Q16) by position pos0 + j's angles,
    intmath.rope_at of the Q14 table cs; p = (k, heads, half, pos0)."""
    k = p[0]
    heads = p[1]
    half = p[2]
    for j in range(k):
        lo = 2 * ((p[3] + j) & 31) * half
        hi = 64 * half + 2 * ((p[3] + j) >> 5) * half
        for i in range(half):
            c1 = (cs[lo + 2 * i] ^ 0x8000) - 0x8000
            s1 = (cs[lo + 2 * i + 1] ^ 0x8000) - 0x8000
            c2 = (cs[hi + 2 * i] ^ 0x8000) - 0x8000
            s2 = (cs[hi + 2 * i + 1] ^ 0x8000) - 0x8000
            c = (c1 * c2 - s1 * s2 + 8192) >> 14
            s = (s1 * c2 + c1 * s2 + 8192) >> 14
            for h in range(heads):
                o = (j * heads + h) * 2 * half + 2 * i
                a = buf[o]
                a = ((((a >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (a & 0xFFFF)
                b = buf[o + 1]
                b = ((((b >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (b & 0xFFFF)
                ah = a >> 15
                al = a & 0x7FFF
                bh = b >> 15
                bl = b & 0x7FFF
                # mulsh(x, m, 14) = (x >> 15) * m * 2 + round((x & 0x7FFF) * m / 2^14)
                buf[o] = ((ah * c - bh * s) << 1) + ((al * c + 8192) >> 14) - ((bl * s + 8192) >> 14)
                buf[o + 1] = ((ah * s + bh * c) << 1) + ((al * s + 8192) >> 14) + ((bl * c + 8192) >> 14)


@micropython.viper
def attend(q: ptr32, kv: ptr8, sc: ptr32, p: ptr32):
    """Attention of k query rows, row j over cache positions t < n + j, every head, in place: row j's
    q[j*heads*hd + h*hd + i] (Q16) becomes head h's output. kv: int8 key rows from kb, value rows from
    vb, `stride` bytes each, the row's shift in its last byte (values + 128: see quant); sc: the scores, then hd ints of scratch
    at `qq`, then the exp table at `tab`. p = (n, hd, stride, kb, vb, heads, group, isq, k, qq, tab).
    docs/CONTRACTS.md section 4."""
    hd = p[1]
    stride = p[2]
    qq = p[9]
    tab = p[10]
    for jh in range(p[8] * p[5]):
        n = p[0] + jh // p[5]
        h = jh % p[5]
        qo = jh * hd
        kh = (h // p[6]) * hd
        # the query head rounded to 15 bits into the scratch
        m = 0
        for i in range(hd):
            v = q[qo + i]
            v = ((((v >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (v & 0xFFFF)
            if v < 0:
                v = 0 - v
            if v > m:
                m = v
        sh = 0
        while (m >> sh) >> 15:
            sh += 1
        qs = 0
        for i in range(hd):
            v = q[qo + i]
            v = (((((v >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (v & 0xFFFF)) + ((1 << sh) >> 1)
            v = v >> sh
            if v > 32767:
                v = 32767
            elif v < -32767:
                v = -32767
            sc[qq + i] = v
            qs += v
        # scores in Q12 and their max
        g = p[7]
        mx = 0
        for t in range(n):
            b = p[3] + t * stride
            a = 0
            for i in range(hd):  # cache bytes are int8 + 128; the query words unextended ...
                a = sc[qq + i] * kv[b + kh + i] + a
            a -= qs << 7  # ... so the sum is right modulo 2^32, and it fits int32
            a = ((((a >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (a & 0xFFFF)
            s = 34 - sh - kv[b + stride - 1]
            if s >= 16:
                a = ((a >> 15) * g + (1 << (s - 16)) + (((a & 0x7FFF) * g) >> 15)) >> (s - 15)
            elif s >= 1:
                a = (((a >> 15) * g) << (15 - s)) + ((((a & 0x7FFF) * g) + (1 << (s - 1))) >> s)
            else:
                a = (a * g) << (0 - s)
            sc[t] = a
            if t == 0 or a > mx:
                mx = a
        # weights expq(mx - score), their sum, the largest value shift
        z = 0
        z0 = 1
        vm = 0
        for t in range(n):
            v = sc[t]
            d = mx - (((((v >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (v & 0xFFFF))
            e = 0
            if d < 65536:
                e = (sc[tab + (d >> 12)] * sc[tab + 16 + ((d >> 6) & 63)] + 16384) >> 15
                e = (e * sc[tab + 80 + (d & 63)] + 16384) >> 15
            sc[t] = e
            z += e
            v = kv[p[4] + t * stride + stride - 1]
            if v > vm:
                vm = v
        rz = (z0 << 30) // z  # z0 = 1: a folded 2^30 would be a boxed constant on 32-bit ports
        # weights times values, summed into the (consumed) query head
        for i in range(hd):
            q[qo + i] = 0
        qs = 0  # the weights' sum: the value bytes are int8 + 128
        for t in range(n):
            b = p[4] + t * stride
            s = 8 + vm - kv[b + stride - 1]
            if s <= 30:
                a = (sc[t] * rz + (1 << (s - 1))) >> s
                if a:
                    qs += a
                    for i in range(hd):
                        q[qo + i] = a * kv[b + kh + i] + q[qo + i]
        s = 22 - vm
        for i in range(qo, qo + hd):
            a = q[i] - (qs << 7)
            a = ((((a >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (a & 0xFFFF)
            if s > 0:
                q[i] = (a + (1 << (s - 1))) >> s
            else:
                q[i] = a << (0 - s)


@micropython.viper
def silu(h1: ptr32, h3: ptr32, tab: ptr32, p: ptr32):
    """h1 = mulsh(mulsh(a, sigmoid(a), 14), b14, 16 - shb) for a in h1, b in h3 (k rows of n, Q16):
    sigmoid by intmath.sigmoid_q14 (the exp table), b14 = b rounded to 14 bits by the row's shift shb.
    p = (n, k)."""
    n = p[0]
    for j in range(p[1]):
        o = j * n
        m = 0
        for i in range(o, o + n):
            v = h3[i]
            v = ((((v >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (v & 0xFFFF)
            if v < 0:
                v = 0 - v
            if v > m:
                m = v
        sh = 0
        while (m >> sh) >> 14:
            sh += 1
        for i in range(o, o + n):
            a = h1[i]
            a = ((((a >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (a & 0xFFFF)
            d = a >> 4
            if a < 0:
                d = (0 - a) >> 4
            e = 0
            if d < 65536:
                e = (tab[d >> 12] * tab[16 + ((d >> 6) & 63)] + 16384) >> 15
                e = (e * tab[80 + (d & 63)] + 16384) >> 15
            g = 536870912 // (32768 + e)
            if a < 0:
                g = 16384 - g
            a = ((a >> 15) * g << 1) + (((a & 0x7FFF) * g + 8192) >> 14)
            b = h3[i]
            b = ((((b >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (b & 0xFFFF)
            b = (b + ((1 << sh) >> 1)) >> sh
            if b > 16383:
                b = 16383
            elif b < -16383:
                b = -16383
            s = 16 - sh
            if s >= 16:
                a = ((a >> 15) * b + 1 + (((a & 0x7FFF) * b) >> 15)) >> 1
            elif s >= 1:
                a = (((a >> 15) * b) << (15 - s)) + ((((a & 0x7FFF) * b) + (1 << (s - 1))) >> s)
            else:
                a = (a * b) << (0 - s)
            h1[i] = a


@micropython.viper
def argmax(a: ptr32, p: ptr32) -> int:
    """Index (from off) of the largest int32 of a[off : off + n], ties to the lowest; p = (off, n)."""
    off = p[0]
    best = 0
    bv = 0
    for i in range(p[1]):
        v = a[off + i]
        v = ((((v >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (v & 0xFFFF)
        if i == 0 or v > bv:
            bv = v
            best = i
    return best
