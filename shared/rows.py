"""Compact rows of the residual stream on the wire: exact, lossless (docs/CONTRACTS.md section 2, STAGE_PACKED).

A pipeline stage's output rows are Q16 int32 values (docs/CONTRACTS.md section 4) that need about 24 bits, so
each row goes as one width byte w (1..4) and its values in w bytes each, little-endian two's complement: the
fewest bytes that hold every value of the row. Rows follow one another; a reader knows n and dim.

    size = pack_rows(x, n, dim, out)        # rows 0..n-1 of the int sequence x into the bytearray out
    unpack_rows(data, n, dim, x)            # and back into x (array('i') or a list); ValueError if malformed
    width(x, off, dim)                      # bytes per value row x[off:off+dim] needs
    MAX_ROW = row_bytes(dim, 4)             # room for one row at its widest

Runs on MicroPython (a stage board packs its reply and unpacks its request) and CPython (the host relays
packed rows as they are; host/projection/pipeline.py prices their measured size). No allocation per call.
"""

# the bounds of a w-byte two's complement value, w = 1..4
_LO = (0, -0x80, -0x8000, -0x800000, -0x80000000)
_HI = (0, 0x7F, 0x7FFF, 0x7FFFFF, 0x7FFFFFFF)


def row_bytes(dim, w):
    """Bytes of one packed row of dim values of w bytes each (the width byte included)."""
    return 1 + dim * w


def width(x, off, dim):
    """The fewest bytes per value (1..4) that hold every value of x[off:off+dim]."""
    lo = hi = 0
    for i in range(off, off + dim):
        v = x[i]
        if v < lo:
            lo = v
        elif v > hi:
            hi = v
    w = 1
    while lo < _LO[w] or hi > _HI[w]:
        w += 1
        if w > 4:
            raise ValueError("value outside int32 in a row")
    return w


def pack_rows(x, n, dim, out):
    """Write rows 0..n-1 of x (dim ints each) into out, each at its own width; returns the bytes written."""
    at = 0
    for r in range(n):
        off = r * dim
        w = width(x, off, dim)
        out[at] = w
        at += 1
        for i in range(off, off + dim):
            v = x[i]
            for _ in range(w):
                out[at] = v & 0xFF
                v >>= 8
                at += 1
    return at


def unpack_rows(data, n, dim, x):
    """Read n packed rows from data (exactly its length) into x[0:n*dim]; ValueError if data is not n rows."""
    at = 0
    end = len(data)
    for r in range(n):
        if at >= end:
            raise ValueError("packed rows end after %d of %d rows" % (r, n))
        w = data[at]
        at += 1
        if w < 1 or w > 4 or at + dim * w > end:
            raise ValueError("packed row %d: width %d for %d bytes left" % (r, w, end - at))
        sign = 1 << (8 * w - 1)
        for i in range(r * dim, (r + 1) * dim):
            v = 0
            s = 0
            for k in range(w):
                v |= data[at + k] << s
                s += 8
            at += w
            x[i] = v - (sign << 1) if v & sign else v
    if at != end:
        raise ValueError("%d bytes after %d packed rows" % (end - at, n))
