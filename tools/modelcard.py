"""Measure the figures of models/MODEL_CARD.md (printed and saved as JSON).

Figures: parameters, file bytes, int8 KV-cache bytes, held-out loss of the float checkpoint (PyTorch)
and of the int8 file (numpy reference engine, host/engine.py) on the same held-out windows, training
time, and speculative-decoding acceptance at gamma = 4, temperature 0 and 1: held-out document
prompts decoded by host/orchestrator.py with the int8 drafter and target engines and the shared
acceptance rule (shared/rule.py).

    python -m tools.modelcard [--prompts 64] [--new 96]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from host.backends import LocalDrafter, LocalVerifier, SessionParams
from host.engine import Engine
from host.gamma import GammaController
from host.orchestrator import generate
from shared.modelfile import tensor_layout
from tools.export import reference_prompts
from tools.train import eval_loss, eval_windows, load_model

GAMMA = 4
LOSS_WINDOWS = 64
SEQ = 256


def n_params(h) -> int:
    """Parameters of a model file (vectors are 1-row entries of the layout)."""
    return sum(r * c for _n, kind, r, c in tensor_layout(h))


def kv_bytes(h, max_seq: int) -> int:
    """int8 KV cache: per layer, k and v, per position kv_dim int8 + one float32 scale."""
    return h.n_layers * 2 * max_seq * (h.kv_dim + 4)


def int8_loss(path: Path, windows: torch.Tensor) -> float:
    eng, tot, n = Engine(path), 0.0, 0
    for w in windows.numpy():
        eng.reset()
        logits = eng.forward(w[:-1], 0).astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        lp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        tot -= lp[np.arange(len(w) - 1), w[1:]].sum()
        n += len(w) - 1
    return tot / n


def acceptance(models: Path, prompts: np.ndarray, new: int, temperature: float) -> dict:
    ver, dra = LocalVerifier(models / "target.spm"), LocalDrafter(models / "drafter.spm")
    acc = tested = drafted = rounds = committed = 0
    for i, p in enumerate(prompts):
        params = SessionParams(seed=1000 + i, temperature=temperature)
        r = generate(list(map(int, p)), ver, dra, params, new, GammaController(fixed=GAMMA))
        for rd in r.rounds:
            acc += rd.n_accepted
            tested += rd.n_accepted + (rd.n_accepted < rd.gamma)
            drafted += rd.gamma
            rounds += 1
            committed += rd.committed
    return {"alpha": acc / tested, "accepted_per_drafted": acc / drafted,
            "tokens_per_verification": committed / rounds, "rounds": rounds, "tokens": committed}


def measure(a) -> dict:
    torch.set_num_threads(a.threads)
    test = np.load(a.corpus / "test.tok.npy")
    windows = eval_windows(test, SEQ, LOSS_WINDOWS)
    out: dict = {"models": {}}
    for name in ("drafter", "target"):
        path = a.models / (name + ".spm")
        eng = Engine(path)
        h = eng.header
        model, ck = load_model(a.checkpoints / name / "best.pt")
        summ = json.loads((a.checkpoints / name / "summary.json").read_text())
        out["models"][name] = {
            "shape": "dim %d, %d layers, %d heads (%d kv), hidden %d, vocab %d, max_seq %d, %s cls" % (
                h.dim, h.n_layers, h.n_heads, h.n_kv_heads, h.hidden, h.vocab, h.max_seq,
                "tied" if h.flags & 1 else "separate"),
            "params": n_params(h),
            "file_bytes": path.stat().st_size, "kv_bytes": kv_bytes(h, h.max_seq),
            "loss_float": eval_loss(model, windows), "loss_int8": int8_loss(path, windows),
            "train_steps": summ["steps"], "train_s": summ["train_s"],
        }
    prompts = reference_prompts(test, a.prompts, a.prompt_len)
    t0 = time.time()
    out["acceptance"] = {"T=0": acceptance(a.models, prompts, a.new, 0.0),
                         "T=1": acceptance(a.models, prompts, a.new, 1.0)}
    out["acceptance_setup"] = {"gamma": GAMMA, "prompts": a.prompts, "prompt_tokens": a.prompt_len,
                               "new_tokens": a.new, "seconds": round(time.time() - t0, 1)}
    out["loss_setup"] = {"windows": LOSS_WINDOWS, "tokens_per_window": SEQ}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, default=Path("models"))
    ap.add_argument("--checkpoints", type=Path, default=Path("checkpoints"))
    ap.add_argument("--corpus", type=Path, default=Path("corpus"))
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=Path("runs/modelcard.json"))
    a = ap.parse_args(argv)
    try:
        figures = measure(a)
    except (OSError, KeyError, ValueError) as e:
        print("modelcard: %s" % e, file=sys.stderr)
        return 1
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
