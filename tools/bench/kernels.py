"""Benchmark of the int8 inference kernels and the firmware engine under the unix MicroPython port.

    python -m tools.bench kernels

Side by side on this machine, same 256 x 256 int8 matrix: MAC/s of the firmware's viper matmul and
its plain-Python fallback (run by the `micropython` binary, tools/bench/_mp_kernels.py) against numpy
(int32 matmul of the int8 values, and the float64 BLAS product the numpy reference engine uses).
Then, in the firmware engine (viper): the verify-cost ratio v(k) = time(k positions) / time(1) for
k = 1..8 with the target, and greedy tokens/s of drafter and target, one position per forward, with
the heap each engine holds and the bytes of boxed-float temporaries one token allocates.
Models: models/drafter.spm and models/target.spm when they exist, else random models of the same
shapes (tools/modeldefs.py CONFIGS). Figures are for the unix port on this CPU, not a board.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("_mp_kernels.py")
BUDGET_MS = 300


def _models() -> dict[str, tuple[Path, str]]:
    return {name: (ROOT / "models" / (name + ".spm"), "models/%s.spm" % name) for name in ("drafter", "target")}


def _numpy_macs() -> dict[str, float]:
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, size=(256, 256), dtype=np.int8)
    w32, w64 = w.astype(np.int32), w.astype(np.float64).T.copy()
    out = {}
    for k in (1, 4):
        x = rng.integers(-127, 128, size=(k, 256), dtype=np.int8)
        for name, fn in (("numpy_int32", lambda: x.astype(np.int32) @ w32.T),
                         ("numpy_f64blas", lambda: x.astype(np.float64) @ w64)):
            fn()
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < BUDGET_MS / 4e3 or n < 2:
                fn()
                n += 1
            out["%s_k%d" % (name, k)] = 256 * 256 * k * n / (time.perf_counter() - t0)
    return out


def _micropython() -> str:
    exe = Path(sys.executable).with_name("micropython")
    if not exe.exists():
        raise RuntimeError("the micropython binary is missing: run `make setup`")
    return str(exe)


def run() -> dict:
    models = _models()
    p = subprocess.run([_micropython(), "-X", "heapsize=8M", str(SCRIPT), str(models["drafter"][0]),
                        str(models["target"][0]), str(BUDGET_MS)],
                       capture_output=True, text=True, cwd=ROOT, timeout=600)
    if p.returncode:
        raise RuntimeError((p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1])
    mp = json.loads(p.stdout)
    macs = dict(mp["macs"], **_numpy_macs())
    print("int8 matmul, 256 x 256, MAC/s (unix port on this CPU)")
    print("%-16s %14s %14s" % ("kernel", "k = 1", "k = 4"))
    for name in ("viper", "python", "numpy_int32", "numpy_f64blas"):
        print("%-16s %14.3g %14.3g" % (name, macs[name + "_k1"], macs[name + "_k4"]))
    print("viper / python fallback: %.0fx (k = 1), %.0fx (k = 4)"
          % (macs["viper_k1"] / macs["python_k1"], macs["viper_k4"] / macs["python_k4"]))
    v = mp["verify"]
    print("\nverify cost, firmware engine, target (%s), after a 32-token prefix" % models["target"][1])
    print("k      " + " ".join("%6d" % k for k in range(1, 9)))
    print("ms     " + " ".join("%6.1f" % (us / 1e3) for us in v["us"]))
    print("v(k)   " + " ".join("%6.2f" % r for r in v["v"]))
    print("\n%-8s %-22s %9s %8s %12s %18s" % ("model", "file", "tok/s", "tokens", "heap bytes",
                                              "transient B/token"))
    for name in ("drafter", "target"):
        r = mp[name]
        print("%-8s %-22s %9.1f %8d %12d %18d" % (name, models[name][1], r["tok_per_s"], r["tokens"],
                                                  r["heap_bytes"], r["transient_bytes_per_token"]))
    return {"macs": macs, "verify": v, "drafter": mp["drafter"], "target": mp["target"],
            "models": {k: v[1] for k, v in models.items()}}
