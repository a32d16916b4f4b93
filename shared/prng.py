"""Counter-based PRNG of specmesh: every random draw is a pure function of (seed, position, purpose).

Runs unchanged under MicroPython and CPython and gives the same numbers on both (docs/CONTRACTS.md
section 1). `rand32` hashes its arguments with three rounds of the lowbias32 mixer (a xorshift-multiply
integer hash with near-ideal avalanche); `uniform` turns it into an exact uniform integer in [0, n) by
masking to the next power of two and rejecting on `attempt`, so no modulo bias enters any decision.
"""

DRAFT = 1  # drafter sampling its token at pos
ACCEPT = 2  # accept test of the draft at pos
EMIT = 3  # residual, bonus and plain-decoding token at pos

_M32 = 0xFFFFFFFF


def _mul32(h, c):
    """h * c mod 2^32 with no product above 2^48 (small ints on 64-bit ports: no heap allocation)."""
    return (h * (c & 0xFFFF) + (((h * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _mix(h):
    h ^= h >> 16
    h = _mul32(h, 0x7FEB352D)
    h ^= h >> 15
    h = _mul32(h, 0x846CA68B)
    return h ^ (h >> 16)


def rand32(seed, pos, purpose, attempt=0):
    """32-bit hash of (seed, pos, purpose, attempt); each argument is taken modulo 2^32 (purpose 2^8)."""
    h = _mix((seed & _M32) ^ 0x9E3779B9)
    h = _mix(h ^ (pos & _M32))
    return _mix(h ^ ((purpose & 0xFF) << 24) ^ (attempt & 0xFFFFFF))


def uniform(seed, pos, purpose, n):
    """Exactly uniform int in [0, n) for 1 <= n <= 2^32, by rejection on `attempt`."""
    if n < 1:
        raise ValueError("uniform needs n >= 1")
    mask = 1
    while mask < n:
        mask <<= 1
    mask -= 1
    attempt = 0
    while True:
        r = rand32(seed, pos, purpose, attempt) & mask
        if r < n:
            return r
        attempt += 1
