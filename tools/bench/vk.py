"""Verify cost v(k) and drafter cost ratio c of the host back-ends, and acceptance per draft position.

    python -m specmesh.tools.bench vk

v(k) = time of one k-position pass of the target over time of a 1-position pass, after a 64-token
prefix, for the numpy engine (`cpu`) and, when PyTorch is installed, the torch engine on the CPU;
c = one drafter token over one target token on the same back-end. Each figure is the fastest of
REPEATS runs (noise only adds time). Acceptance: the shipped pair at gamma 4, T = 0 and T = 1, on
PROMPTS held-out stories (tools/modelcard.py's setup, fewer stories), alpha at each draft position.
The board engine's v(k) is the kernels section's. tools/bench/_report.py plots all of them.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.host.cli.registry import factory
from specmesh.host.decode.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
KS = range(1, 9)
PREFIX = 64
REPEATS = 7
PROMPTS = 16
NEW = 64


def _pass_seconds(name: str, path: Path, k: int) -> float:
    """Fastest time of one k-token pass of back-end `name`'s engine after PREFIX tokens."""
    engine = factory("verifier", name)(path).stream.engine  # forward(tokens, start_pos), rollback(n)
    rng = np.random.default_rng(k)
    engine.forward([int(t) for t in rng.integers(3, 512, PREFIX)], 0)
    best = float("inf")
    for _ in range(REPEATS):
        engine.rollback(PREFIX)
        toks = [int(t) for t in rng.integers(3, 512, k)]
        t0 = time.perf_counter()
        engine.forward(toks, PREFIX)
        best = min(best, time.perf_counter() - t0)
    return best


def backend_costs(name: str) -> dict:
    target = {k: _pass_seconds(name, MODELS / TARGET_FILE, k) for k in KS}
    drafter = _pass_seconds(name, MODELS / DRAFTER_FILE, 1)
    return {"v": {k: target[k] / target[1] for k in KS}, "c": drafter / target[1],
            "target_token_s": target[1], "drafter_token_s": drafter}


def acceptance() -> dict:
    from specmesh.tools.modelcard import acceptance as measure, heldout_prompts

    prompts = heldout_prompts(MODELS, Tokenizer.from_llama2c(MODELS / "tokenizer.bin"), PROMPTS)
    return {t: measure(MODELS / TARGET_FILE, MODELS / DRAFTER_FILE, prompts, NEW, float(t[2:]))
            for t in ("T=0", "T=1")}


def run() -> dict:
    out: dict = {"backends": {}}
    names = ["cpu"]
    try:
        import torch  # noqa: F401

        names.append("torch-cpu")
    except ImportError:
        out["skipped"] = {"torch-cpu": "PyTorch is not installed (make setup-gpu)"}
    for name in names:
        out["backends"][name] = backend_costs(name)
    out["acceptance"] = acceptance()
    print("v(k) of the target and drafter cost ratio c (fastest of %d, after a %d-token prefix)" % (REPEATS, PREFIX))
    print("%-10s %s %8s %12s" % ("back-end", " ".join("v(%d)" % k for k in KS), "c", "target ms"))
    for name, f in out["backends"].items():
        print("%-10s %s %8.3f %12.3f" % (name, " ".join("%4.2f" % f["v"][k] for k in KS), f["c"],
                                          1e3 * f["target_token_s"]))
    print("acceptance at gamma 4 (%d held-out stories, %d tokens each): alpha per draft position" % (PROMPTS, NEW))
    for t, a in out["acceptance"].items():
        print("%-4s alpha %.3f  tokens/verification %.2f  per position %s" % (
            t, a["alpha"], a["tokens_per_verification"],
            " ".join("-" if x is None else "%.2f" % x for x in a["alpha_per_position"])))
    return out
