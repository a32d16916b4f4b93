"""shared/rows.py's packed rows in viper: what a stage board runs (the same bytes, tests/test_rows.py), since
the plain-Python codec costs about a millisecond a row on a board, more than it saves on a fast link.

    size = pack_rows(x, n, dim, out)        # x: array('i'), out: a bytearray of n * rows.MAX_ROW bytes at least
    unpack_rows(data, n, dim, x)            # ValueError when data is not n packed rows
"""

import micropython

# Loads from ptr32 are sign-extended by hand, as in firmware/kernels.py: a 64-bit emitter (the virtual boards)
# does not, a 32-bit board's needs nothing.


@micropython.viper
def _pack(x: ptr32, n: int, dim: int, out: ptr8) -> int:
    at = 0
    for r in range(n):
        off = r * dim
        lo = 0
        hi = 0
        for i in range(off, off + dim):
            v = x[i]
            v = ((((v >> 16) & 0xFFFF) ^ 0x8000) - 0x8000) << 16 | (v & 0xFFFF)  # sign-extended (kernels.py)
            if v < lo:
                lo = v
            if v > hi:
                hi = v
        w = 1
        if lo < -0x80 or hi > 0x7F:
            w = 2
        if lo < -0x8000 or hi > 0x7FFF:
            w = 3
        if lo < -0x800000 or hi > 0x7FFFFF:
            w = 4
        out[at] = w
        at += 1
        for i in range(off, off + dim):
            v = x[i]
            for _ in range(w):
                out[at] = v & 0xFF
                v = v >> 8
                at += 1
    return at


@micropython.viper
def _unpack(data: ptr8, size: int, n: int, dim: int, x: ptr32) -> int:
    """0, or the 1-based row that is malformed (n + 1: bytes left after the last row)."""
    at = 0
    for r in range(n):
        if at >= size:
            return r + 1
        w = data[at]
        at += 1
        if w < 1 or w > 4 or at + dim * w > size:
            return r + 1
        sign = 1 << (8 * w - 1)
        for i in range(r * dim, (r + 1) * dim):
            v = 0
            s = 0
            for k in range(w):
                v = v | (data[at + k] << s)
                s += 8
            at += w
            if v & sign:  # negative: its upper bytes all ones (the low 32 bits on 32- and 64-bit emitters alike)
                v = v - (sign << 1)
            x[i] = v
    if at != size:
        return n + 1
    return 0


def pack_rows(x, n, dim, out):
    return _pack(x, n, dim, out)


def unpack_rows(data, n, dim, x):
    bad = _unpack(data, len(data), n, dim, x)
    if bad:
        raise ValueError("packed rows malformed at row %d of %d" % (bad, n))
