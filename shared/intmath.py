"""The integer model arithmetic's constants and scalar steps (docs/CONTRACTS.md section 4), exact everywhere.

Runs unchanged under MicroPython and CPython. Everything here is integer arithmetic (Python's exact
ints, big ones only at load time), so the firmware and the host derive the very same numbers:

    rshr(a, s)                   round(a / 2^s), half up (a << -s when s <= 0)
    mulsh(a, m, s)               rshr(a * m, s): the one rescaling step (fixed-point multiplier m)
    bitlen(n), isqrt(n)          bit length, floor square root of n >= 0
    fixed_packed(bits)           a float32 weight scale (its IEEE bits, >= 0) as m | s << 16, the scale
                                 ~ m / 2^s with m = round(mantissa / 2^10) in 2^13..2^14, s = 140 - exponent
    fixed_vector(v)              float32s (their bits) as ints with one common shift s, in place; s
    eps_q32(bits)                a float32 epsilon as round(eps * 2^32)
    inv_rms(ss, dim, e, sh)      (g, s): the RMSNorm factor of a row whose 10-bit sum of squares is ss
    expq(d, tab)                 round(2^15 * exp(-d / 2^12)) for d >= 0, from tab = exp_table(...)
    sigmoid_q14(a, tab)          sigmoid of Q16 a in Q14, from expq (SiLU by the exp table)
    exp_table(out)               exp(-k), exp(-j/64), exp(-j/4096) (k < 16, j < 64), Q15: 144 entries
    rope_table(bits, hd, n, out) cos, sin of p * theta^(-2i/hd) for p < 32 and p = 32q, Q14
    rope_at(tab, hd, p, i)       (cos, sin) at any position p, from the two parts

Tables are computed from series in 60-bit fixed point (exact integer operations, in a fixed order).
"""

_P = 60
_ONE = 1 << _P

EXP_SIZE = 144
ROPE_LO = 32
EXP_SPAN = 16 << 12  # exp arguments are Q12; exp(-16) * 2^15 < 1: beyond this a weight is 0


def rshr(a, s):
    """round(a / 2^s), ties up; a shift left for s <= 0."""
    if s <= 0:
        return a << -s
    return (a + (1 << (s - 1))) >> s


def mulsh(a, m, s):
    """rshr(a * m, s)."""
    return rshr(a * m, s)


def bitlen(n):
    """Number of bits of n >= 0 (0 for 0)."""
    b = 0
    while n >> b:
        b += 1
    return b


def isqrt(n):
    """floor(sqrt(n)) for n >= 0 (Newton's method on ints)."""
    if n <= 0:
        return 0
    x = 1 << ((bitlen(n) + 1) >> 1)
    while True:
        y = (x + n // x) >> 1
        if y >= x:
            return x
        x = y


def _unpack(bits):
    """(sign, 24-bit mantissa, biased exponent) of a normal float32's bits; a zero or denormal gives 0s."""
    e = (bits >> 23) & 0xFF
    if e == 0:
        return 0, 0, 0
    return -1 if (bits >> 31) & 1 else 1, (bits & 0x7FFFFF) | 0x800000, e


def fixed_packed(bits):
    """m | s << 16 (see the module docstring); 0 for a zero scale. One int: no garbage at load."""
    e = (bits >> 23) & 0xFF
    if e == 0:
        return 0
    return (((bits & 0x7FFFFF) | 0x800000) + 512) >> 10 | (140 - e) << 16


def fixed_vector(v):
    """Turn the float32 bits (signed or not) in v, in place, into ints with one common shift s, each
    value ~ int / 2^s and the largest rounded to 2^13..2^14; returns s. Allocates nothing."""
    top = 0
    for b in v:
        if (b >> 23) & 0xFF > top:
            top = (b >> 23) & 0xFF
    for i in range(len(v)):
        b = v[i]
        e = (b >> 23) & 0xFF
        m = rshr((b & 0x7FFFFF) | 0x800000, 10 + top - e) if e else 0
        v[i] = -m if (b >> 31) & 1 else m
    return 140 - top


def eps_q32(bits):
    """round(eps * 2^32) of a non-negative float32 epsilon."""
    _, mant, e = _unpack(bits)
    return rshr(mant, 118 - e) if mant else 0


def inv_rms(ss, dim, eps, sh):
    """(g, s) such that x * g / 2^s ~ x / sqrt(mean square + eps), in Q16, for a row whose values
    shifted right by `sh` have the sum of squares ss; eps = eps_q32(...). (0, 0) when it is zero.

    t = ss // dim + (eps >> 2sh), scaled by 4^n into [2^28, 2^30); g = 2^28 // isqrt(t 4^n); s = 12 + sh - n.
    """
    t = ss // dim + (eps >> (2 * sh))
    if t <= 0:
        return 0, 0
    n = 0
    while t < (1 << 28):
        t <<= 2
        n += 1
    return (1 << 28) // isqrt(t), 12 + sh - n


def expq(d, tab):
    """round(2^15 exp(-d / 2^12)) for d >= 0 (0 from d >= EXP_SPAN): exp(-d >> 12) exp(-((d >> 6) & 63) / 64)
    exp(-(d & 63) / 4096) from the exp table, Q15, each product rounded."""
    if d >= EXP_SPAN:
        return 0
    e = (tab[d >> 12] * tab[16 + ((d >> 6) & 63)] + 16384) >> 15
    return (e * tab[80 + (d & 63)] + 16384) >> 15


def sigmoid_q14(a, tab):
    """sigmoid of Q16 a in Q14: 2^29 // (2^15 + expq(|a| >> 4)) for a >= 0, 2^14 minus that below 0."""
    s = (1 << 29) // (32768 + expq((a if a >= 0 else -a) >> 4, tab))
    return s if a >= 0 else (1 << 14) - s


# -- load-time tables: 60-bit fixed-point series --------------------------------------------------

def _exp(x):
    """exp(x) for fixed-point x >= 0 (Taylor series)."""
    total = 0
    term = _ONE
    k = 1
    while term:
        total += term
        term = term * x // (k << _P)
        k += 1
    return total


def _ln_mant(num, den):
    """ln(num / den) for 1 <= num/den <= 2, fixed point: 2 atanh((num - den) / (num + den))."""
    u = ((num - den) << _P) // (num + den)
    u2 = (u * u) >> _P
    total = 0
    term = u
    k = 1
    while term:
        total += term // k
        term = (term * u2) >> _P
        k += 2
    return 2 * total


def _sincos(x):
    """(sin x, cos x) for fixed-point 0 <= x <= 1 (Taylor series)."""
    s = c = 0
    term = _ONE
    k = 0
    while term:
        if k & 1:
            s += term if k & 2 == 0 else -term
        else:
            c += term if k & 2 == 0 else -term
        k += 1
        term = term * x // (k << _P)
    return s, c


def _q(v, bits):
    """Fixed-point v rounded to `bits` fractional bits."""
    return rshr(v, _P - bits)


def exp_table(out):
    """Fill out[0:EXP_SIZE] with exp(-k) for k < 16, exp(-j/64) and exp(-j/4096) for j < 64, Q15."""
    o = 0
    for step, n in ((0, 16), (6, 64), (12, 64)):
        r = (_ONE << _P) // _exp(_ONE >> step)
        v = _ONE
        for _ in range(n):
            out[o] = _q(v, 15)
            o += 1
            v = (v * r) >> _P
    return out


def rope_size(hd, n_ctx):
    """Entries of rope_table(..., hd, n_ctx, out)."""
    return (ROPE_LO + (n_ctx + ROPE_LO - 1) // ROPE_LO) * hd


def rope_table(theta_bits, hd, n_ctx, out):
    """Fill out with the Q14 cos and sin of p * f_i, f_i = theta^(-2i/hd), i < hd/2, interleaved, for
    p < ROPE_LO (cos at out[2(p * hd/2 + i)], sin after it) and then for p = ROPE_LO * q, q < n_ctx /
    ROPE_LO (at out[ROPE_LO * hd + 2(q * hd/2 + i)]); rope_at() combines them for any position.

    Each p's rotation is p-1's times f_i's, in 60-bit fixed point; q's is q-1's times ROPE_LO f_i's.
    """
    _, mant, e = _unpack(theta_bits)
    ln_theta = _ln_mant(mant, 1 << 23) + (e - 150 + 23) * _ln_mant(2, 1)
    half = hd // 2
    for i in range(half):
        ds, dc = _sincos((_ONE << _P) // _exp(ln_theta * 2 * i // hd))
        for base, n in ((0, ROPE_LO), (ROPE_LO * hd, (n_ctx + ROPE_LO - 1) // ROPE_LO)):
            s, c = 0, _ONE
            for p in range(n):
                out[base + 2 * (p * half + i)] = _q(c, 14)
                out[base + 2 * (p * half + i) + 1] = _q(s, 14)
                s, c = (s * dc + c * ds) >> _P, (c * dc - s * ds) >> _P
            ds, dc = s, c  # after ROPE_LO steps: the rotation by ROPE_LO f_i
    return out


def rope_at(tab, hd, p, i):
    """(cos, sin) Q14 of p * f_i: the low part's rotation (p % ROPE_LO) times the high part's."""
    half = hd // 2
    lo = 2 * ((p % ROPE_LO) * half + i)
    hi = ROPE_LO * hd + 2 * ((p // ROPE_LO) * half + i)
    c1, s1, c2, s2 = tab[lo], tab[lo + 1], tab[hi], tab[hi + 1]
    return rshr(c1 * c2 - s1 * s2, 14), rshr(s1 * c2 + c1 * s2, 14)
