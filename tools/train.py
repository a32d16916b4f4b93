"""Train a model of the family on the corpus (cross-entropy), or distil it from a teacher (KL to the
teacher's distributions), with a progress bar, a wall-clock budget and resumable checkpoints.

Checkpoints go to <out>/last.pt (every eval) and <out>/best.pt (lowest held-out loss); re-running the
same command resumes from last.pt. Batches are a pure function of (seed, step), so a resumed run sees
the same data as an uninterrupted one.

    python -m tools.train --config target --out checkpoints/target --steps 3000 --minutes 40
    python -m tools.train --config drafter --out checkpoints/drafter --teacher checkpoints/target/best.pt
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from host.tokenizer import Tokenizer
from tools.modeldefs import CONFIGS, ModelArgs, Transformer


def token_file(corpus: Path, split: str, tokenizer: Path) -> np.ndarray:
    """The split's tokens (uint16), each document preceded by BOS; cached next to the corpus."""
    cache = corpus / (split + ".tok.npy")
    src = corpus / (split + ".txt")
    if cache.exists() and cache.stat().st_mtime >= max(src.stat().st_mtime, tokenizer.stat().st_mtime):
        return np.load(cache)
    tok = Tokenizer.from_json(tokenizer)
    docs = src.read_text("utf-8").split("\n\n")
    ids = np.concatenate([np.array(e, dtype=np.uint16) for e in tok.encode_batch(docs)])
    np.save(cache, ids)
    return ids


def batch(data: np.ndarray, n: int, seq: int, seed: int, step: int) -> torch.Tensor:
    """n windows of seq+1 tokens at positions drawn from (seed, step)."""
    g = np.random.default_rng([seed, step])
    starts = g.integers(0, len(data) - seq - 1, size=n)
    return torch.from_numpy(np.stack([data[s:s + seq + 1] for s in starts]).astype(np.int64))


def eval_windows(data: np.ndarray, seq: int, n: int) -> torch.Tensor:
    """Fixed, evenly spaced held-out windows of seq+1 tokens."""
    starts = np.linspace(0, len(data) - seq - 2, n).astype(np.int64)
    return torch.from_numpy(np.stack([data[s:s + seq + 1] for s in starts]).astype(np.int64))


@torch.no_grad()
def eval_loss(model: Transformer, windows: torch.Tensor, bs: int = 32) -> float:
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, len(windows), bs):
        w = windows[i:i + bs]
        logits = model(w[:, :-1])
        tot += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum").item()
        n += w[:, 1:].numel()
    model.train()
    return tot / n


def load_model(path: Path) -> tuple[Transformer, dict]:
    """A model from a checkpoint (float, eval mode) and the checkpoint dict."""
    ck = torch.load(path, map_location="cpu", weights_only=False)
    m = Transformer(ModelArgs(**ck["config"]))
    m.load_state_dict(ck["model"])
    return m.eval(), ck


def lr_at(step: int, train_s: float, a) -> float:
    """Linear warm-up, then cosine decay to 10% over the run's progress: the larger of the step
    fraction and the time-budget fraction, so a run on a busy machine still ends fully decayed."""
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    t = (step - a.warmup) / max(1, a.steps - a.warmup)
    if a.minutes:
        t = max(t, train_s / (a.minutes * 60))
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, t))))


def train(a) -> dict:
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    data = token_file(a.corpus, "train", a.tokenizer)
    windows = eval_windows(token_file(a.corpus, "test", a.tokenizer), a.seq, a.eval_windows)
    cfg = CONFIGS[a.config]
    model = Transformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.1, betas=(0.9, 0.95))
    teacher = load_model(Path(a.teacher))[0] if a.teacher else None
    state = {"step": 0, "train_s": 0.0, "best": float("inf"), "history": []}
    last = out / "last.pt"
    if last.exists():
        ck = torch.load(last, map_location="cpu", weights_only=False)
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        state = ck["state"]
        print("resuming %s at step %d" % (last, state["step"]))
    elif a.init:
        model.load_state_dict(load_model(Path(a.init))[0].state_dict())

    def save(path: Path):
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state,
                    "config": cfg.to_dict(), "args": {k: str(v) for k, v in vars(a).items()}}, path)

    if a.minutes and state["train_s"] >= a.minutes * 60:
        print("%s already used its %g min budget" % (last, a.minutes))
        a.steps = state["step"]
    t0 = time.time() - state["train_s"]
    bar = tqdm(range(state["step"], a.steps), initial=state["step"], total=a.steps, desc=a.config,
               mininterval=5, file=sys.stdout)
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = lr_at(step, time.time() - t0, a)
        x = batch(data, a.batch, a.seq, a.seed, step)
        logits = model(x[:, :-1])
        flat = logits.reshape(-1, logits.shape[-1])
        if teacher is not None:
            with torch.no_grad():
                tl = teacher(x[:, :-1]).reshape(-1, logits.shape[-1])
            loss = F.kl_div(F.log_softmax(flat, -1), F.log_softmax(tl, -1), log_target=True, reduction="batchmean")
        else:
            loss = F.cross_entropy(flat, x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        state["step"] = step + 1
        state["train_s"] = time.time() - t0
        bar.set_postfix(loss="%.3f" % loss.item(), lr="%.1e" % opt.param_groups[0]["lr"], refresh=False)
        over = a.minutes and state["train_s"] > a.minutes * 60
        if state["step"] % a.eval_every == 0 or state["step"] == a.steps or over:
            ev = eval_loss(model, windows)
            state["history"].append((state["step"], round(state["train_s"], 1), round(loss.item(), 4), round(ev, 4)))
            bar.write("step %d  %.0fs  train %.4f  held-out %.4f" % (state["step"], state["train_s"], loss.item(), ev))
            if ev < state["best"]:
                state["best"] = ev
                save(out / "best.pt")
            save(last)
            if over:
                bar.write("time budget of %g min reached" % a.minutes)
                break
    bar.close()
    summary = {"config": a.config, "params": model.n_params(), "steps": state["step"],
               "train_s": round(state["train_s"], 1), "best_heldout_loss": state["best"]}
    (out / "summary.json").write_text(json.dumps(summary | {"history": state["history"]}, indent=1))
    return summary


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", choices=sorted(CONFIGS), required=True)
    ap.add_argument("--out", required=True, help="checkpoint directory")
    ap.add_argument("--corpus", type=Path, default=Path("corpus"))
    ap.add_argument("--tokenizer", type=Path, default=Path("models/tokenizer.json"))
    ap.add_argument("--teacher", help="checkpoint to distil from (KL to its distributions)")
    ap.add_argument("--init", help="checkpoint to start from (e.g. a plain pre-training)")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--minutes", type=float, default=0, help="stop after this much training time")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-windows", type=int, default=64)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    for p in (a.corpus / "train.txt", a.tokenizer) + ((Path(a.teacher),) if a.teacher else ()):
        if not p.exists():
            print("train: %s not found (run `python -m tools.train_all`)" % p, file=sys.stderr)
            return 1
    print(json.dumps(train(a)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
