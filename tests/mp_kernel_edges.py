"""The kernels at the edges of their shift counts, under MicroPython (tests/test_kernel_edges.py runs it on
the unix port; any board can run it): requant, embed and rmsnorm with scale exponents that make the
rounding shift 30..150 and the left shift 31..100, rmsnorm rows whose block shift makes eps's shift 32 or
more. Prints one line per module it could import: `name kernel:first-differing-case ...` against
refkernels (the reference; array('i') keeps the exact value modulo 2^32), or `name ok`.

Run from the repository root with firmware/ and . on sys.path (the unix port), or with kernels.py,
refkernels.py, shared/ and native/ beside it on a board."""

import sys
from array import array

sys.path[:0] = ["firmware", "."]
import kernels
import refkernels

SHIFTS = (-100, -64, -40, -33, -32, -31, -17, -1, 0, 1, 15, 16, 29, 30, 31, 32, 33, 45, 46, 47, 48,
          63, 64, 65, 79, 80, 81, 95, 96, 97, 127, 128, 140, 150)
ACC = (0, 1, -1, 4095, -4096, (1 << 30) - 1, -(1 << 30), 123456789, -987654321, 2147483647, -2147483647)


def field(s):
    """ms's shift field: the 16 bits above the multiplier, as an int32 word (negative for s < 0 or
    s >= 2^15)."""
    v = (s & 0xFFFF) << 16
    return v - (1 << 32) if v >= 1 << 31 else v


def requant_case(K, s, add):
    n = len(ACC)
    acc = array("i", ACC)
    ms = array("i", [0] * n)
    for r in range(n):
        ms[r] = field(s) | (8192 + r * 731)
    dst = array("i", [r * 1000 - 5000 for r in range(n)])
    K.requant(dst, acc, ms, array("i", (n, 1, 0, n, 0, add, 0, 0, 0)))
    return list(dst)


def embed_case(K, s):
    w = bytearray(range(0, 256, 15))
    ms = array("i", (field(s + 16) | 16383,))
    dst = array("i", [0] * len(w))
    K.embed(dst, w, ms, array("i", (len(w), 0, 0)))
    return list(dst)


def rmsnorm_case(K, qw, big):
    dim = 8
    src = array("i", [((i * 2654435761) % 4001 - 2000) << (18 if big else 4) for i in range(dim)])
    if big:
        src[3] = (1 << 30) + 12345  # a block shift of 21: eps's shift is 42
    wn = array("i", [16384 - i * 3000 for i in range(dim)])
    dst = array("i", [0] * dim)
    K.rmsnorm(dst, src, wn, array("i", (dim, 1, qw, 2147483647 if big else 42950)))
    return list(dst)


def cases():
    for s in SHIFTS:
        for add in (0, 1):
            yield "requant", "s=%d add=%d" % (s, add), lambda K, s=s, add=add: requant_case(K, s, add)
        yield "embed", "s=%d" % s, lambda K, s=s: embed_case(K, s)
    for qw in (13, 30, 45, 46, 47, 63, 64, 80, 100):  # qw <= 0 leaves int32 before the second rounding
        for big in (0, 1):
            yield "rmsnorm", "qw=%d big=%d" % (qw, big), lambda K, qw=qw, big=big: rmsnorm_case(K, qw, big)


def modules():
    out = [("viper", kernels)]
    arch = sys.implementation._mpy >> 10 if hasattr(sys.implementation, "_mpy") else 0
    name = {2: "x64", 11: "rv32imc", 10: "xtensawin"}.get(arch)  # py/persistentcode.h
    if name:
        try:
            out.append(("native", __import__("native." + name, None, None, [name])))
        except ImportError:
            pass
    return out


def main():
    mods = modules()  # first: a native module wants one block of the heap
    bad = [{} for _ in mods]
    for kernel, case, fn in cases():
        ref = fn(refkernels)
        for i, (_, K) in enumerate(mods):
            if kernel not in bad[i] and fn(K) != ref:
                bad[i][kernel] = case
    for (label, _), b in zip(mods, bad):
        print(label, " ".join("%s:%s" % kv for kv in sorted(b.items())) or "ok")


main()
