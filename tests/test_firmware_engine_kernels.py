"""The viper kernels (firmware/kernels.py) against their plain-Python reference (firmware/refkernels.py).

Each kernel runs on the same inputs both ways under the real micropython binary and must give the same
ints: random inputs over many magnitudes, both signs, zero rows, inputs at the int16 and int32 bounds the
engine allows, and every branch of the rescaling step (shifts <= 0, 1..15, >= 16). Offsets into the
buffers are non-zero, so an indexing slip shows.
"""

import json
import subprocess

import numpy as np

from tests.conftest import ROOT

SCRIPT = r'''
import sys, json
sys.path[:0] = ["firmware", "."]
from array import array
import kernels, refkernels
from shared import intmath
d = json.load(open(sys.argv[-1]))
tab = intmath.exp_table(array("i", range(intmath.EXP_SIZE)))
rope = intmath.rope_table(d["theta"], 8, 70, array("h", range(intmath.rope_size(8, 70))))
out = {}
for name, K in (("viper", kernels), ("ref", refkernels)):
    r = []
    for c in d["matmul"]:
        p = array("i", [c["rows"], c["cols"], c["k"], c["r0"]] + [7] * (12 + c["rows"] * c["k"]))
        K.matmul(bytearray(c["w"]), array("i", c["x"] + [99]), 0, p)  # one word of slack
        r.append(list(p))
    for c in d["quant"]:
        wide = c["bits"] > 7
        dst = array("i", [0] * (4 * c["n"] + 9)) if wide else bytearray(4 * c["n"] + 9)
        p = array("i", [2, c["n"] // 2, 3, c["bits"], 2, 2, c["n"] + 2, 0, 0, 0])  # 2 rows, row step n + 2
        K.quant(dst, array("i", c["src"]), p)
        r.append([list(p), list(dst)])
    for c in d["requant"]:
        dst = array("i", c["dst"])
        p = array("i", [c["n"], c["k"], 1, c["n"] + 2, 2, c["add"], 0, 0] + c["sh"])
        K.requant(dst, array("i", c["acc"]), array("i", c["ms"]), p)
        r.append(list(dst))
    for c in d["rows"]:
        x = array("i", c["x"])
        dst = array("i", [0] * len(x))
        K.rmsnorm(dst, x, array("i", c["w"]), array("i", [c["dim"], c["k"], c["qw"], 42950]))
        h1 = array("i", c["x"])
        K.silu(h1, array("i", c["b"]), tab, array("i", [c["dim"], c["k"]]))
        buf = array("i", c["x"])
        K.rope(buf, rope, array("i", [c["k"], c["dim"] // 8, 4, c["pos"]]))
        e = array("i", [0] * c["dim"])
        for t in range(c["k"]):
            K.embed(e, bytearray(c["w8"]), array("i", c["ms"]), array("i", [c["dim"] - 2, t, 1]))
        pa = array("i", [0, len(c["x"])])
        r.append([list(dst), list(h1), list(buf), list(e), K.argmax(array("i", c["x"]), pa)])
    for c in d["attn"]:
        n, hd, stride = c["n"], 8, 17
        sc = array("i", [0] * (n + hd + intmath.EXP_SIZE))
        intmath.exp_table(memoryview(sc)[n + hd:])
        q = array("i", c["q"])  # 2 query rows of 3 heads (2 kv heads: group 2), the second sees one more
        p = array("i", [n - 1, hd, stride, 0, n * stride, 3, 2, 5792, 2, n, n + hd])
        K.attend(q, bytearray(c["kv"]), sc, p)
        r.append([list(q), list(sc)])
    out[name] = r
print(json.dumps(out))
'''


def cases(rng):
    def ints(n, lo, hi):
        return rng.integers(lo, hi, n, endpoint=True).tolist()

    d = {"theta": 1176256512, "matmul": [], "quant": [], "requant": [], "rows": [], "attn": []}
    for rows, cols, k in ((5, 40, 1), (3, 172, 4), (4, 33, 5), (2, 516, 7), (3, 24, 6), (2, 30, 13), (2, 9, 2)):
        x = ints(k * cols, -32767, 32767)  # interleaved: position j's column c at c*k + j
        if k > 1:
            x[::k] = [32767] * cols  # the int32 bound: 127 * 32767 * 516 < 2^31
        d["matmul"].append({"rows": rows, "cols": cols, "k": k, "r0": 1, "x": x,
                            "w": [v & 255 for v in ints((rows + 1) * cols, -127, 127)]})
    for bits in (7, 14, 15):
        for scale in (0, 1, 1000, 1 << 20, (1 << 31) - 1):
            src = ints(40, -scale, scale)
            d["quant"].append({"bits": bits, "n": 36, "src": src})
    for add in (0, 1):
        for n, k in ((6, 1), (5, 4)):
            ms = [m | s << 16 for m, s in zip(ints(n + 1, 0, 1 << 14), ints(n + 1, 0, 40))]
            d["requant"].append({"n": n, "k": k, "add": add, "ms": ms, "sh": ints(k, 0, 24),
                                 "acc": ints(n * k, -(1 << 31) + 1, (1 << 31) - 1),
                                 "dst": ints((n + 2) * k + 2, -(1 << 20), 1 << 20)})
    for dim, k, scale in ((16, 1, 0), (32, 2, 70000), (64, 3, 1 << 22), (24, 1, 1 << 29)):
        x = ints(dim * k, -scale, scale)
        d["rows"].append({"dim": dim, "k": k, "x": x, "b": ints(dim * k, -scale, scale), "qw": int(rng.integers(1, 20)),
                          "w": ints(dim, -(1 << 14), 1 << 14), "pos": int(rng.integers(0, 64)),
                          "w8": [v & 255 for v in ints(dim * k, -127, 127)],
                          "ms": [m | s << 16 for m, s in zip(ints(k, 0, 1 << 14), ints(k, 0, 30))]})
    for n in (2, 9, 20):
        kv = [v & 255 for v in ints(2 * n * 17, -127, 127)]
        for t in range(2 * n):
            kv[t * 17 + 16] = int(rng.integers(0, 13))  # keys and values up to 2^(12 + 7 - 16) = 8
        for scale in (1 << 18, 1 << 22):  # queries up to 64: scores within the Q12 int32 bound
            d["attn"].append({"n": n, "kv": kv, "q": ints(48, -scale, scale)})
    return d


def test_viper_kernels_equal_the_reference(micropython, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(cases(np.random.default_rng(7))))
    script = tmp_path / "k.py"
    script.write_text(SCRIPT)
    p = subprocess.run([micropython, "-X", "heapsize=32M", str(script), str(plan)], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert len(out["viper"]) == len(out["ref"]) == 36
    for i, (a, b) in enumerate(zip(out["viper"], out["ref"])):
        assert a == b, "case %d" % i
