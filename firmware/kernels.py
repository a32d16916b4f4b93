"""Viper kernels of the firmware engine: int8 x int8 -> int32 matmul, the two attention products, absmax.

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
