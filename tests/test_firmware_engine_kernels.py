"""The firmware's float32-on-integer kernels (firmware/kernels.py) against numpy float32, bit for bit.

quant8 (activation quantization), scale (matmul output scaling), argmax and absmax work on IEEE-754
bit patterns inside viper code; each must give exactly what numpy's float32 arithmetic gives, and the
plain-Python fallbacks in firmware/engine.py must agree with them (argmax: -1 on a NaN, which
Engine.argmax raises as a ValueError, as rule.argmax and host.engine.argmax do). Inputs: random vectors over many
magnitudes, zeros, exact half-integer quotients and their float32 neighbours, ties.
"""

import json
import subprocess

import numpy as np

from host.engine import quantize_act
from tests.conftest import ROOT

SCRIPT = r'''
import sys, json
sys.path[:0] = ["firmware", "."]
from array import array
import kernels, engine
d = json.load(open(sys.argv[-1]))
class Slots:  # all the engine's Python fallbacks use of self: their float32 slots
    f1, f2 = array("f", [0.0]), array("f", [0.0])
E, e = engine.Engine, Slots()
out = {}
for name, q8 in (("viper", kernels.quant8), ("python", lambda *a: E._quant8_py(e, *a))):
    rows = []
    for row, s in zip(d["x"], d["s"]):
        dst = bytearray(len(row))
        q8(dst, array("f", row), array("f", [s]), array("i", (0, len(row), 0)))
        rows.append([(b ^ 128) - 128 for b in dst])
    out["quant8_" + name] = rows
n, k = d["n"], d["k"]
for name, sc in (("viper", kernels.scale), ("python", lambda *a: E._scale_py(e, *a))):
    dst = array("f", range(n * k))
    sc(dst, array("i", d["acc"]), array("f", d["ws"]), array("f", d["xs"]), array("i", (n, k, 0, n, 0)))
    out["scale_" + name] = [dst[i] for i in range(n * k)]
for name, am, ab in (("viper", kernels.argmax, kernels.absmax), ("python", engine._argmax_py, engine._absmax_py)):
    out["argmax_" + name] = [am(array("f", r), array("i", (0, len(r)))) for r in d["am"]]
    out["absmax_" + name] = [ab(array("f", r), array("i", (0, len(r)))) for r in d["am"]]
    nan = float("nan")
    out["argmax_nan_" + name] = [am(array("f", r), array("i", (0, len(r))))
                                 for r in ([1.0, nan, 0.5], [nan, 1.0], [-nan, 2.0], [-1.0, 0.5, -nan])]
e.vocab, e.pa, e.logits = 3, array("i", (0, 0)), array("f", [1.0, float("nan"), 0.5])
for e._argmax in (kernels.argmax, engine._argmax_py):
    try:
        E.argmax(e, 0)
    except ValueError as x:
        out.setdefault("engine_nan", []).append(str(x))
print(json.dumps(out))
'''


def test_float_kernels_match_numpy_bit_for_bit(micropython, tmp_path):
    rng = np.random.default_rng(7)
    x = [(rng.normal(size=64) * 10.0 ** rng.integers(-6, 4)).astype(np.float32) for _ in range(60)]
    x[0][:20] = 0
    s = np.float32(0.3)
    v = np.array([np.nextafter(np.float32(j + 0.5), np.float32(d)) for j in range(-127, 127) for d in (-1e9, 1e9)]
                 + [np.float32(j + 0.5) for j in range(-127, 127)] + [np.float32(0.5) - np.float32(2 ** -25)],
                 dtype=np.float32)
    x.append((v * s).astype(np.float32))
    xq, xs = zip(*(quantize_act(r[None, :]) for r in x))
    xs = [float(a[0]) for a in xs]
    xs[-1] = float(s)  # the boundary row is quantized with the scale it was built for
    want_q8 = [q[0].tolist() for q in xq[:-1]] + [
        np.clip(np.floor(x[-1] / s + np.float32(0.5)), -127, 127).astype(int).tolist()]
    n, k = 500, 3
    acc = (rng.integers(-2 ** 26, 2 ** 26, size=(k, n)) // rng.integers(1, 2 ** 16, size=(k, n))).astype(np.int32)
    acc[0, :10] = 0
    ws = (rng.random(n) * 10.0 ** rng.integers(-8, 2, n)).astype(np.float32)
    sc = (rng.random(k) * 0.1 + 1e-4).astype(np.float32)
    am = [rng.normal(size=33).astype(np.float32) for _ in range(20)]
    am.append(np.array([-3, -1, -2, -1], np.float32))
    am.append(np.array([-0.0, 0.0, -5.0], np.float32))
    plan = tmp_path / "in.json"
    plan.write_text(json.dumps({"x": [r.tolist() for r in x], "s": xs, "n": n, "k": k,
                                "acc": acc.reshape(-1).tolist(), "ws": ws.tolist(), "xs": sc.tolist(),
                                "am": [r.tolist() for r in am]}))
    script = tmp_path / "k.py"
    script.write_text(SCRIPT)
    p = subprocess.run([micropython, "-X", "heapsize=32M", str(script), str(plan)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    want_scale = (acc.astype(np.float32) * ws[None, :] * sc[:, None]).reshape(-1)
    for impl in ("viper", "python"):
        assert got["quant8_" + impl] == want_q8, impl
        np.testing.assert_array_equal(np.array(got["scale_" + impl], np.float32).view(np.int32),
                                      want_scale.view(np.int32), err_msg=impl)
        assert got["argmax_" + impl] == [int(np.argmax(r)) for r in am], impl
        assert got["absmax_" + impl] == [int(np.argmax(np.abs(r))) for r in am], impl
        assert got["argmax_nan_" + impl] == [-1] * 4, impl  # a NaN anywhere, either sign: no token
    assert got["engine_nan"] == ["nan"] * 2  # Engine.argmax turns it into a ValueError
