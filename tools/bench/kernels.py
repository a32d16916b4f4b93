"""Benchmark of the firmware engine under the unix MicroPython port: today's integer engine with the native
C kernels a node picks (firmware/native/x64.mpy), the same engine with the viper kernels, and the float
engine they replaced, side by side on the same model files.

    python -m specmesh.tools.bench kernels

The float engine is taken from git history (commit FLOAT_ENGINE: firmware/engine.py, kernels.py and the
shared/modelfile.py it read) into a temporary folder; without git history only today's engine runs.
Each engine runs in its own `micropython` process (tools/bench/_mp_kernels.py), ROUNDS times,
alternating; each figure is the fastest round (noise only adds time), and per-token times are also
given in units of `ref_us`, the fastest run of a fixed interpreted-Python workload timed in the same
processes, so figures from different runs or machines compare as ratios. Printed: per-token time of drafter and target (greedy, one
position per forward), heap bytes one token allocates, v(1..8) with the target, the speed-up of the
native kernels over viper on the same VM (per-token time of viper / native), and the MAC/s of today's
matmul kernels (native, viper, the plain-Python reference) next to numpy on the same 256 x 256 matrix, and the
host CPU back-ends' engines side by side (host/backends/pipeengine.py against numpy, ms a position; models/drafter-host.spm too). Models: models/drafter.spm and models/target.spm (stories260K). Figures are for the unix port on this
CPU, not a board.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

from specmesh.host import atomic
from specmesh.host.layout import HOST_DRAFTER_FILE, micropython_binary

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("_mp_kernels.py")
FLOAT_ENGINE = "d751430"  # the last commit with the float engine
BUDGET_MS = 300
ROUNDS = 5


def _models() -> dict[str, tuple[Path, str]]:
    return {name: (ROOT / "models" / (name + ".spm"), "models/%s.spm" % name) for name in ("drafter", "target")}


def _float_engine(tmp: Path) -> Path | None:
    """The float engine's files from git history, or None without it."""
    out = tmp / "float_engine"
    (out / "shared").mkdir(parents=True)
    for src, dst in (("firmware/engine.py", "engine.py"), ("firmware/kernels.py", "kernels.py"),
                     ("shared/__init__.py", "shared/__init__.py"), ("shared/modelfile.py", "shared/modelfile.py")):
        p = subprocess.run(["git", "show", "%s:%s" % (FLOAT_ENGINE, src)], cwd=ROOT, capture_output=True)
        if p.returncode:
            return None
        atomic.write_bytes(out / dst, p.stdout)
    return out


def _numpy_macs() -> dict[str, float]:
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, size=(256, 256), dtype=np.int8).astype(np.float64).T.copy()
    out = {}
    for k in (1, 5):
        x = rng.integers(-32767, 32768, size=(k, 256)).astype(np.float64)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < BUDGET_MS / 4e3 or n < 2:
            x @ w
            n += 1
        out["numpy_k%d" % k] = 256 * 256 * k * n / (time.perf_counter() - t0)
    return out


def _run_engine(engine_dir: str, kernels: str, models: dict) -> dict:
    exe = micropython_binary()
    if exe is None:
        raise RuntimeError("the micropython binary is missing: run `make setup`")
    p = subprocess.run([exe, "-X", "heapsize=8M", str(SCRIPT), engine_dir, str(models["drafter"][0]),
                        str(models["target"][0]), str(BUDGET_MS)] + ([kernels] if kernels else []),
                       capture_output=True, text=True, cwd=ROOT,
                       timeout=600)
    if p.returncode:
        raise RuntimeError((p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1])
    return json.loads(p.stdout)


def _host_engines(models: dict) -> dict:
    """ms a greedy position (one position a forward, the fastest of 3 runs of 100) of the host CPU back-ends'
    engines on each model: the board's engine in a micropython process (host/backends/pipeengine.py, None where it
    cannot run native kernels) and the numpy one it falls back to."""
    from specmesh.host.backends.engine import Engine, argmax
    from specmesh.host.backends.pipeengine import PipeEngine

    out: dict = {}
    for name, (path, _) in models.items():
        row = out[name] = {}
        for kind, engine in (("pipe", PipeEngine.start(path)), ("numpy", Engine(path))):
            if engine is None:
                row[kind] = None
                continue
            best = float("inf")
            for _ in range(3):
                engine.reset()
                t, t0 = argmax(engine.forward([1], 0)[-1]), time.perf_counter()
                for _ in range(100):
                    t = argmax(engine.forward([t])[-1])
                best = min(best, (time.perf_counter() - t0) * 10)  # ms a position
            row[kind] = best
            if kind == "pipe":
                engine.close()
    return out


def _best(runs: list[dict]) -> dict:
    """The fastest of the rounds, figure by figure (other processes only ever add time), and the
    per-token times in units of the fastest reference workload."""
    ref = min(r["ref_us"] for r in runs)
    us = [min(r["verify"]["us"][k] for r in runs) for k in range(8)]
    out = {"ref_us": ref, "v": [u / us[0] for u in us], "verify_us": us}
    for m in ("drafter", "target"):
        out[m + "_us"] = min(r[m]["us_per_token"] for r in runs)
        out[m + "_ref"] = out[m + "_us"] / ref
        out[m + "_bytes"] = max(r[m]["bytes_per_token"] for r in runs)
    return out


def run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        models = _models()
        old_dir = _float_engine(Path(tmp))
        # "integer": today's engine as a node runs it (native kernels); "viper": the same engine, viper kernels
        engines = {"integer": ("firmware", "native"), "viper": ("firmware", "viper")}
        engines |= {"float": (str(old_dir), "")} if old_dir else {}
        runs: dict[str, list[dict]] = {name: [] for name in engines}
        for _ in range(ROUNDS):
            for name, (d, kernels) in engines.items():
                runs[name].append(_run_engine(d, kernels, models))
    best = {name: _best(r) for name, r in runs.items()}
    print("firmware engine, unix port; 'ref' = per-token time / a fixed Python workload in the same process")
    print("models: drafter %s, target %s" % (models["drafter"][1], models["target"][1]))
    print("%-8s %12s %10s %12s %10s %14s %14s" % ("engine", "drafter us", "ref", "target us", "ref",
                                               "drafter B/tok", "target B/tok"))
    for name, b in best.items():
        print("%-8s %12.0f %10.3f %12.0f %10.3f %14d %14d" % (name, b["drafter_us"], b["drafter_ref"], b["target_us"],
                                                         b["target_ref"], b["drafter_bytes"], b["target_bytes"]))
    out: dict = {"engines": best, "models": {k: v[1] for k, v in models.items()}}
    out["native_speedup"] = {m: best["viper"][m + "_us"] / best["integer"][m + "_us"] for m in ("drafter", "target")}
    print("native kernels against viper, same engine and VM (per-token time, viper / native): drafter %.2fx, "
          "target %.2fx" % (out["native_speedup"]["drafter"], out["native_speedup"]["target"]))
    if "float" in best:
        out["speedup"] = {m: best["float"][m + "_ref"] / best["integer"][m + "_ref"] for m in ("drafter", "target")}
        print("speed-up of the integer engine (ref-normalised): drafter %.2fx, target %.2fx"
              % (out["speedup"]["drafter"], out["speedup"]["target"]))
    print("\nverify cost v(k) = time(k positions) / time(1), target, after a 32-token prefix")
    print("k        " + " ".join("%6d" % k for k in range(1, 9)))
    for name, b in best.items():
        print("%-8s " % name + " ".join("%6.2f" % v for v in b["v"]))
    macs = dict(runs["integer"][0]["macs"], **_numpy_macs())
    print("\nmatmul 256 x 256 (int8 weights x int16 inputs), MAC/s")
    for name in ("native", "viper", "python", "numpy"):
        print("%-8s k=1 %10.3g   k=5 %10.3g" % (name, macs[name + "_k1"], macs[name + "_k5"]))
    out["macs"] = macs
    host_drafter = ROOT / "models" / HOST_DRAFTER_FILE  # what --drafter cpu runs (no board does)
    host = out["host_engine_ms"] = _host_engines(models | {"drafter-host": (host_drafter, str(host_drafter))})
    print("\nhost CPU back-ends (--drafter cpu, --verifier cpu), ms a greedy position: the board's engine in a "
          "micropython process against numpy")
    for name, row in host.items():
        pipe = row["pipe"]
        print("%-8s pipe %s   numpy %.3f   %s" % (name, "%.3f" % pipe if pipe else "-", row["numpy"],
                                                 "%.1fx" % (row["numpy"] / pipe) if pipe else "(no native kernels)"))
    return out
