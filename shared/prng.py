"""Counter-based PRNG of specmesh: every random draw is a pure function of (seed, position, purpose).

Runs unchanged under MicroPython and CPython and gives the same numbers on both (docs/CONTRACTS.md
section 1). `rand32` hashes its arguments with three rounds of the lowbias32 mixer (a xorshift-multiply
integer hash with near-ideal avalanche), computed in 16-bit halves so that a 32-bit port allocates nothing;
`uniform` turns it into an exact uniform integer in [0, n) by
masking to the next power of two and rejecting on `attempt`, so no modulo bias enters any decision.
"""

DRAFT = 1  # drafter sampling its token at pos
ACCEPT = 2  # accept test of the draft at pos
EMIT = 3  # residual, bonus and plain-decoding token at pos

_M32 = 0xFFFFFFFF
_C1_HI = 0x7FEB  # lowbias32's multipliers, 0x7FEB352D and 0x846CA68B, in 16-bit halves
_C1_LO = 0x352D
_C2_HI = 0x846C
_C2_LO = 0xA68B


def _draw(seed, pos, purpose, attempt, mask_hi, mask_lo):
    """The hash of rand32, masked: ((h >> 16) & mask_hi) << 16 | (h & mask_lo). The state is kept in 16-bit halves
    and every product in bytes of the multiplier, so no intermediate reaches 2^30: on a 32-bit port (31-bit small
    ints, py/mpconfig.h MICROPY_OBJ_REPR_A) nothing is allocated, and neither is the result below 2^30."""
    hi = lo = 0
    for r in range(3):
        if r == 0:
            hi ^= ((seed >> 16) & 0xFFFF) ^ 0x9E37
            lo ^= (seed & 0xFFFF) ^ 0x79B9
        elif r == 1:
            hi ^= (pos >> 16) & 0xFFFF
            lo ^= pos & 0xFFFF
        else:
            hi ^= ((purpose & 0xFF) << 8) | ((attempt >> 16) & 0xFF)
            lo ^= attempt & 0xFFFF
        for k in range(2):
            if k == 0:
                lo ^= hi  # h ^= h >> 16
                c_hi = _C1_HI
                c_lo = _C1_LO
            else:
                lo ^= ((hi << 1) & 0xFFFF) | (lo >> 15)  # h ^= h >> 15
                hi ^= hi >> 15
                c_hi = _C2_HI
                c_lo = _C2_LO
            # h = h * c mod 2^32, c's halves taken a byte at a time: each product below 2^24
            t1 = lo * (c_lo >> 8)
            low = lo * (c_lo & 0xFF) + ((t1 & 0xFF) << 8)
            t2 = hi * (c_lo >> 8)
            t3 = lo * (c_hi >> 8)
            hi = ((low >> 16) + (t1 >> 8) + hi * (c_lo & 0xFF) + ((t2 & 0xFF) << 8) + lo * (c_hi & 0xFF)
                  + ((t3 & 0xFF) << 8)) & 0xFFFF
            lo = low & 0xFFFF
        lo ^= hi  # h ^= h >> 16
    return ((hi & mask_hi) << 16) | (lo & mask_lo)


def rand32(seed, pos, purpose, attempt=0):
    """32-bit hash of (seed, pos, purpose, attempt); each argument is taken modulo 2^32 (purpose 2^8)."""
    return _draw(seed, pos, purpose, attempt, 0xFFFF, 0xFFFF)


def uniform(seed, pos, purpose, n):
    """Exactly uniform int in [0, n) for 1 <= n <= 2^32, by rejection on `attempt`."""
    if n < 1:
        raise ValueError("uniform needs n >= 1")
    mask = 1
    while mask < n:
        mask <<= 1
    mask -= 1
    mask_hi = mask >> 16
    mask_lo = mask & 0xFFFF
    attempt = 0
    while True:
        r = _draw(seed, pos, purpose, attempt, mask_hi, mask_lo)
        if r < n:
            return r
        attempt += 1
