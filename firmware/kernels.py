"""Viper kernels of the firmware engine: int8 x int8 -> int32 matmul, the two attention products, absmax,
and the float32 steps around the matmul: activation quantization and output scaling (integer arithmetic
on IEEE-754 bits, rounding as float32 hardware and numpy do, no float objects).

Compiled to machine code by MicroPython's viper emitter (x64 on the unix port, xtensawin on ESP32 and
ESP32-S3). `engine.py` holds plain-Python fallbacks with the same signatures and results for ports
without a native emitter. Every kernel takes buffers and `p`, an array('i') of sizes and offsets, so a
call allocates nothing. int8 bytes are sign-extended as (b ^ 0x80) - 0x80, int16 as (h ^ 0x8000) - 0x8000,
and only small constants appear, so the 32-bit (xtensawin) and 64-bit (x64) emitters compute the same.
All sums stay inside int32 for the shapes the engine accepts (see engine.py).
"""

import micropython


@micropython.viper
def matmul(acc: ptr32, w: ptr8, x: ptr8, p: ptr32):
    """acc[j*rows + r] = sum_c w[(r0 + r)*cols + c] * x[j*cols + c] for r < rows, j < k.

    p = (rows, cols, k, r0): a block of `rows` weight rows from row r0 (big matrices go in blocks).

    Each weight byte is loaded once per group of up to 4 positions (4 accumulators in registers).
    """
    rows = p[0]
    cols = p[1]
    k = p[2]
    r0 = p[3]
    for r in range(rows):
        wo = (r0 + r) * cols
        j = 0
        while j < k:
            x0 = j * cols
            n = k - j
            if n >= 4:
                x1 = x0 + cols
                x2 = x1 + cols
                x3 = x2 + cols
                a0 = 0
                a1 = 0
                a2 = 0
                a3 = 0
                for c in range(cols):
                    v = (w[wo + c] ^ 0x80) - 0x80
                    a0 += v * ((x[x0 + c] ^ 0x80) - 0x80)
                    a1 += v * ((x[x1 + c] ^ 0x80) - 0x80)
                    a2 += v * ((x[x2 + c] ^ 0x80) - 0x80)
                    a3 += v * ((x[x3 + c] ^ 0x80) - 0x80)
                acc[j * rows + r] = a0
                acc[(j + 1) * rows + r] = a1
                acc[(j + 2) * rows + r] = a2
                acc[(j + 3) * rows + r] = a3
                j += 4
            elif n >= 2:
                x1 = x0 + cols
                a0 = 0
                a1 = 0
                for c in range(cols):
                    v = (w[wo + c] ^ 0x80) - 0x80
                    a0 += v * ((x[x0 + c] ^ 0x80) - 0x80)
                    a1 += v * ((x[x1 + c] ^ 0x80) - 0x80)
                acc[j * rows + r] = a0
                acc[(j + 1) * rows + r] = a1
                j += 2
            else:
                a0 = 0
                for c in range(cols):
                    a0 += ((w[wo + c] ^ 0x80) - 0x80) * ((x[x0 + c] ^ 0x80) - 0x80)
                acc[j * rows + r] = a0
                j += 1


@micropython.viper
def qk(out: ptr32, kc: ptr8, q: ptr16, p: ptr32):
    """out[2t] = sum_i q[i] * kc[t*stride + off + i], out[2t+1] = sum_i q[hd+i] * kc[...] for t < n.

    The query is a 30-bit int split in two int16 halves: q[i] the signed high part, q[hd+i] the low
    15 bits (non-negative); p = (n, hd, stride, off).
    """
    n = p[0]
    hd = p[1]
    stride = p[2]
    off = p[3]
    for t in range(n):
        b = t * stride + off
        hi = 0
        lo = 0
        for i in range(hd):
            k = (kc[b + i] ^ 0x80) - 0x80
            hi += ((q[i] ^ 0x8000) - 0x8000) * k
            lo += q[hd + i] * k
        out[2 * t] = hi
        out[2 * t + 1] = lo


@micropython.viper
def av(out: ptr32, vc: ptr8, wt: ptr32, p: ptr32):
    """out[i] = sum_t wt[t] * vc[t*stride + off + i] for i < hd, t < n: attention weights x int8 values.

    p = (n, hd, stride, off); wt holds non-negative weights summing to at most 2^23 + n.
    """
    n = p[0]
    hd = p[1]
    stride = p[2]
    off = p[3]
    for i in range(hd):
        out[i] = 0
    for t in range(n):
        a = wt[t]
        if a:
            b = t * stride + off
            for i in range(hd):
                out[i] += a * ((vc[b + i] ^ 0x80) - 0x80)


@micropython.viper
def absmax(a: ptr32, p: ptr32) -> int:
    """Index of the largest |a[i]| for off <= i < off + n (the first on ties); p = (off, n).

    `a` is an array('f') read as raw IEEE-754 bits: without the sign bit, bit patterns order like
    magnitudes. Compared as two 16-bit halves so 32- and 64-bit emitters agree.
    """
    off = p[0]
    best = off
    bh = 0
    bl = 0
    for i in range(off, off + p[1]):
        v = a[i]
        h = (v >> 16) & 0x7FFF
        lo = v & 0xFFFF
        if h > bh or (h == bh and lo > bl):
            bh = h
            bl = lo
            best = i
    return best


@micropython.viper
def scale(dst: ptr32, acc: ptr32, ws: ptr32, xs: ptr32, p: ptr32):
    """dst[j*stride + d0 + r] = f32(f32(f32(acc[j*n + r]) * ws[r0 + r]) * xs[j]) as float32 bits, for
    r < n, j < k; p = (n, k, r0, stride, d0). Rounding to nearest even, as IEEE float32 hardware and
    numpy do; scales are positive normal floats (a zero scale gives 0.0)."""
    n = p[0]
    k = p[1]
    r0 = p[2]
    stride = p[3]
    d0 = p[4]
    for j in range(k):
        xb = xs[j]
        xe = (xb >> 23) & 0xFF
        xm = (xb & 0x7FFFFF) | 0x800000
        for r in range(n):
            a = acc[j * n + r]
            neg = (a >> 31) & 1
            if neg:
                a = 0 - a
                a = (a & 0xFFFF) | (((a >> 16) & 0x7FFF) << 16)
            wb = ws[r0 + r]
            we = (wb >> 23) & 0xFF
            if a == 0 or we == 0 or xe == 0:
                dst[j * stride + d0 + r] = 0
                continue
            # int -> float32 (m in [2^23, 2^24), exponent e), round to nearest even
            e = 150
            m = a
            if m < 0x800000:
                while m < 0x800000:
                    m = m << 1
                    e -= 1
            elif m >= 0x1000000:
                sh = 0
                t = m
                while t >= 0x1000000:
                    t = t >> 1
                    sh += 1
                rem = m - (t << sh)
                half = 1 << (sh - 1)
                if rem > half or (rem == half and (t & 1)):
                    t += 1
                    if t == 0x1000000:
                        t = 0x800000
                        sh += 1
                m = t
                e = 150 + sh
            # two float32 multiplies: by ws[r0 + r], then by xs[j]
            for step in range(2):
                if step == 0:
                    bm = (wb & 0x7FFFFF) | 0x800000
                    be = we
                else:
                    bm = xm
                    be = xe
                ah = m >> 12
                al = m & 0xFFF
                bh = bm >> 12
                bl = bm & 0xFFF
                mid = ah * bl + al * bh
                lo = al * bl + ((mid & 0xFFF) << 12)
                hi = ah * bh + (mid >> 12) + (lo >> 24)
                lo = lo & 0xFFFFFF
                e = e + be - 127
                if hi >= 0x800000:
                    m = hi
                    rb = lo
                    e += 1
                else:
                    m = (hi << 1) | (lo >> 23)
                    rb = (lo << 1) & 0xFFFFFF
                if rb > 0x800000 or (rb == 0x800000 and (m & 1)):
                    m += 1
                    if m == 0x1000000:
                        m = 0x800000
                        e += 1
            if e <= 0:
                dst[j * stride + d0 + r] = 0
            else:
                dst[j * stride + d0 + r] = (neg << 31) | (e << 23) | (m & 0x7FFFFF)


@micropython.viper
def quant8(dst: ptr8, src: ptr32, sc: ptr32, p: ptr32):
    """dst[do + i] = clip(floor(f32(src[so + i] / s) + 0.5), -127, 127) as int8 bytes, i < n, where
    s = sc[0] (a positive normal float32) and src holds float32 bits; p = (so, n, do).

    The quotient is rounded to nearest even like a float32 division; the + 0.5 is exact in float32
    for every quotient but 0.5 - 2^-25, which float32 rounds up to 1.0 (handled)."""
    sb = sc[0]
    se = (sb >> 23) & 0xFF
    sm = (sb & 0x7FFFFF) | 0x800000
    so = p[0]
    do = p[2]
    for i in range(p[1]):
        xb = src[so + i]
        xe = (xb >> 23) & 0xFF
        q = 0
        if xe:
            neg = (xb >> 31) & 1
            r = (xb & 0x7FFFFF) | 0x800000
            # long division: d = floor(mx * 2^25 / ms), 26 quotient bits
            d = 0
            for _ in range(26):
                d = d << 1
                if r >= sm:
                    r -= sm
                    d = d | 1
                r = r << 1
            if d >= 0x2000000:
                m = d >> 2
                half = (d >> 1) & 1
                sticky = (d & 1) | (1 if r else 0)
                e = xe - se - 23
            else:
                m = d >> 1
                half = d & 1
                sticky = 1 if r else 0
                e = xe - se - 24
            if half and (sticky or (m & 1)):
                m += 1
                if m == 0x1000000:
                    m = 0x800000
                    e += 1
            # the quotient is m * 2^e (e <= -16 since |x/s| < 128): q = floor(+-m * 2^e + 0.5)
            sh = 0 - e
            if sh >= 25:
                if not neg and m == 0xFFFFFF and sh == 25:
                    q = 1
            elif neg:
                h = 1 << (sh - 1)
                if m > h:
                    q = 0 - ((m - h + (1 << sh) - 1) >> sh)
            else:
                q = (m + (1 << (sh - 1))) >> sh
            if q > 127:
                q = 127
            elif q < -127:
                q = -127
        dst[do + i] = q & 0xFF


@micropython.viper
def argmax(a: ptr32, p: ptr32) -> int:
    """Index (from off) of the largest of a[off : off + n], float32 bits; ties go to the lowest; p = (off, n).

    Bit patterns order like floats once negatives are negated (the magnitude is built from 16-bit
    halves so it stays below 2^31 on 32-bit emitters); -0.0 equals 0.0. -1 if any value is a NaN.
    """
    off = p[0]
    best = 0
    bk = 0
    for i in range(p[1]):
        v = a[off + i]
        if (v >> 23) & 0xFF == 0xFF and v & 0x7FFFFF:
            return -1
        mag = (((v >> 16) & 0x7FFF) << 16) | (v & 0xFFFF)
        key = (0 - mag) if (v >> 31) & 1 else mag
        if i == 0 or key > bk:
            bk = key
            best = i
    return best
