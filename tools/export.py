"""Export trained checkpoints to specmesh model files (int8 per row) plus reference outputs.

models/<name>.spm is written with host/modelio.py; the header's tokenizer id is the CRC-32 of
models/vocab.bin. models/reference.npz keeps, for each exported model, a few held-out prompts, the
float model's logits at every prompt position and its greedy continuation, so the core tests can
check the int8 engine against the float model without PyTorch:
    <name>.tokens int32 [P, T], <name>.logits float16 [P, T, vocab],
    <name>.prompt int32 [P, G0], <name>.greedy int32 [P, G] (float greedy tokens after the prompt),
    <name>.margin float32 [P, G] (float top-1 minus top-2 logit at each greedy step: near-ties show)

    python -m tools.export --model target=checkpoints/target/best.pt --model drafter=checkpoints/drafter/best.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from host.modelio import write_model
from host.tokenizer import BOS, vocab_id
from shared.modelfile import FLAG_SHARED_CLS, Header
from tools.modeldefs import Transformer, export_tensors
from tools.train import load_model

REF_PROMPTS = 3
REF_LEN = 64  # teacher-forced positions with saved logits
GREEDY_PROMPT = 24
GREEDY_NEW = 24


def header_of(model: Transformer, tokenizer_id: int) -> Header:
    a = model.a
    return Header(a.dim, a.n_layers, a.n_heads, a.n_kv_heads, a.hidden, a.vocab, a.max_seq,
                  flags=FLAG_SHARED_CLS if a.shared_cls else 0, tokenizer_id=tokenizer_id,
                  norm_eps=a.norm_eps, rope_theta=a.rope_theta)


def export_model(model: Transformer, path: Path, tokenizer_id: int) -> Header:
    """Write `model` as an int8 model file; returns the written header."""
    return write_model(path, header_of(model, tokenizer_id), export_tensors(model))


def reference_prompts(test_tokens: np.ndarray, n: int = REF_PROMPTS, length: int = REF_LEN) -> np.ndarray:
    """n held-out documents' first `length` tokens (BOS included), evenly spread over the test split."""
    starts = [int(i) for i in np.flatnonzero(test_tokens == BOS) if i + length <= len(test_tokens)
              and not (test_tokens[i + 1:i + length] == BOS).any()]
    pick = [starts[int(j)] for j in np.linspace(0, len(starts) - 1, n)]
    return np.stack([test_tokens[s:s + length] for s in pick]).astype(np.int32)


@torch.no_grad()
def greedy(model: Transformer, prompt: np.ndarray, n: int) -> tuple[list[int], list[float]]:
    """n greedy tokens after prompt, and the float top-1 minus top-2 logit margin of each choice."""
    seq, margins = [int(t) for t in prompt], []
    for _ in range(n):
        top = model(torch.tensor([seq]))[0, -1].topk(2)
        seq.append(int(top.indices[0]))
        margins.append(float(top.values[0] - top.values[1]))
    return seq[len(prompt):], margins


@torch.no_grad()
def reference(models: dict[str, Transformer], test_tokens: np.ndarray) -> dict[str, np.ndarray]:
    toks = reference_prompts(test_tokens)
    out = {}
    for name, m in models.items():
        m.eval()
        out[name + ".tokens"] = toks
        out[name + ".logits"] = m(torch.from_numpy(toks.astype(np.int64))).numpy().astype(np.float16)
        out[name + ".prompt"] = toks[:, :GREEDY_PROMPT]
        runs = [greedy(m, p, GREEDY_NEW) for p in toks[:, :GREEDY_PROMPT]]
        out[name + ".greedy"] = np.array([r[0] for r in runs], np.int32)
        out[name + ".margin"] = np.array([r[1] for r in runs], np.float32)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True, metavar="NAME=CHECKPOINT")
    ap.add_argument("--out", type=Path, default=Path("models"))
    ap.add_argument("--test-tokens", type=Path, default=Path("corpus/test.tok.npy"))
    a = ap.parse_args(argv)
    try:
        tid = vocab_id((a.out / "vocab.bin").read_bytes())
        test_tokens = np.load(a.test_tokens)
        models = {}
        for spec in a.model:
            name, _, ck = spec.partition("=")
            if not ck:
                raise ValueError("--model wants NAME=CHECKPOINT, got %r" % spec)
            models[name] = load_model(Path(ck))[0]
    except (OSError, ValueError) as e:
        print("export: %s" % e, file=sys.stderr)
        return 1
    for name, m in models.items():
        path = a.out / (name + ".spm")
        export_model(m, path, tid)
        print("export: %s  %d params  %d bytes" % (path, m.n_params(), path.stat().st_size))
    np.savez_compressed(a.out / "reference.npz", **reference(models, test_tokens))
    print("export: %s" % (a.out / "reference.npz"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
