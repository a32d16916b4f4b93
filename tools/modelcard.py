"""Measure the figures of models/MODEL_CARD.md (printed and saved as JSON).

Figures: parameters, file bytes, int8 KV-cache bytes, held-out loss of the float model (saved in
models/reference.npz at export) and of the int8 file (numpy engine, host/backends/engine.py) on the same
held-out stories; speculative-decoding acceptance at gamma = 4, temperature 0 and 1, q-hat = the
drafter's top 8: held-out stories (models/heldout.txt, from story 128 on: no model trained on them and
no checkpoint was selected with them), their first 16 tokens as the prompt, decoded by
host/decode/orchestrator.py with both int8 engines and the shared acceptance rule; alpha per draft position.
The shipped drafters (the boards' two and the host's, models/drafter-host.spm) are also measured so on both held-out prompt sets (tools/heldout.py: the
TinyStories tuning set and the hand-written report set, each prompt whole), `acceptance_by_set`.
With --variants, every drafter checkpoint tried (tools/train.py's best.pt) is exported to a scratch
file and measured the same way, for the table of variants.

    python -m specmesh.tools.modelcard [--prompts 64] [--new 96] [--variants checkpoints/sweep-*]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from specmesh.tools import DEFAULT, output_problem, run_tool, said
from specmesh.host import atomic
from specmesh.host.backends import BackendError, LocalDrafter, LocalVerifier, SessionParams
from specmesh.host.backends.engine import Engine, to_float
from specmesh.host.cli.flags import a_path
from specmesh.host.cli.ranges import RangeError, in_range
from specmesh.host.cli.streams import STDOUTS
from specmesh.host.boardclasses import ESP32, ESP32S3, kv_bytes
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import generate
from specmesh.host.decode.tokenizer import Tokenizer, TokenizerError
from specmesh.host.layout import DRAFTER_FILE, HOST_DRAFTER_FILE, MODELS, TARGET_FILE, models_folder_problem
from specmesh.tools.reference import read_reference
from specmesh.tools.heldout import (
    LOSS_STORIES, PROMPT_SETS, PROMPT_TOKENS, heldout_prompts, heldout_stories, prompt_set,
)
from specmesh.shared.modelfile import ModelFileError, tensor_layout

GAMMA = 4


def n_params(h) -> int:
    """Parameters of a model file (vectors are 1-row entries of the layout)."""
    return sum(r * c for _n, kind, r, c in tensor_layout(h))


def int8_loss(path: Path, stories: list[list[int]]) -> float:
    eng, tot, n = Engine(path), 0.0, 0
    for ids in stories:
        eng.reset()
        logits = to_float(eng.forward(ids[:-1], 0))
        logits -= logits.max(axis=1, keepdims=True)
        lp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        tot -= lp[np.arange(len(ids) - 1), ids[1:]].sum()
        n += len(ids) - 1
    return tot / n


def acceptance(target: Path, drafter: Path, prompts: list[list[int]], new: int, temperature: float) -> dict:
    """alpha (accepted / tested drafts), tokens per verification and alpha at each draft position."""
    ver, dra = LocalVerifier(target), LocalDrafter(drafter)
    acc = tested = rounds = committed = 0
    reached, passed = [0] * GAMMA, [0] * GAMMA  # drafts tested / accepted at position i of their round
    for i, p in enumerate(prompts):
        params = SessionParams(seed=1000 + i, temperature=temperature)
        r = generate(p, ver, dra, params, new, GammaController(fixed=GAMMA))
        for rd in r.rounds:
            acc += rd.n_accepted
            tested += rd.n_accepted + (rd.n_accepted < rd.gamma)
            rounds += 1
            committed += rd.n_committed
            for j in range(min(rd.gamma, rd.n_accepted + 1)):
                reached[j] += 1
                passed[j] += j < rd.n_accepted
    if not tested:  # --new 1 (the first token is the prefill's), or no held-out story long enough for a prompt
        raise ValueError("no draft was tested (%d prompts, %d new tokens each): give more prompts or --new 2 or more"
                         % (len(prompts), new))
    return {"alpha": acc / tested, "tokens_per_verification": committed / rounds, "rounds": rounds,
            "tokens": committed, "alpha_per_position": [p / r if r else None for p, r in zip(passed, reached)]}


def measure_pair(target: Path, drafter: Path, prompts: list[list[int]], new: int) -> dict:
    return {"T=0": acceptance(target, drafter, prompts, new, 0.0),
            "T=1": acceptance(target, drafter, prompts, new, 1.0)}


def describe(h) -> str:
    return "dim %d, %d layers, %d heads (%d kv), hidden %d" % (h.dim, h.n_layers, h.n_heads, h.n_kv_heads,
                                                             h.hidden)


def summary_of(ck: Path) -> dict:
    """The summary.json tools/train.py wrote in the checkpoint folder `ck`; ValueError naming it where it is none."""
    path = ck / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except ValueError:  # not JSON, or not UTF-8: the decoder's own line names no file
        summary = None
    if not isinstance(summary, dict) or not {"steps", "train_s"} <= summary.keys():
        raise ValueError("%s is not tools/train.py's summary (no steps and train_s in a JSON object): give checkpoint "
                         "folders of tools/train.py" % path)
    return summary


def check_variants(folders: list[Path]) -> None:
    """Each --variants folder's summary and checkpoint read (ValueError or OSError saying which is damaged): before the
    minutes of measuring the shipped models, not after them."""
    if not folders:  # (a card without variants needs no torch)
        return
    from specmesh.tools.export import load_float  # needs torch, only for variants

    for ck in folders:
        summary_of(ck)
        load_float(ck / "best.pt")


def variant(ck: Path, models: Path, prompts: list[list[int]], new: int) -> dict:
    """Export one drafter checkpoint to a scratch file and measure it against the shipped target."""
    from specmesh.tools.export import export_model, load_float, tokenizer_id_of  # needs torch, only for variants

    summary = summary_of(ck)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / DRAFTER_FILE
        h = export_model(load_float(ck / "best.pt"), path, tokenizer_id_of(models))
        return {"checkpoint": str(ck), "shape": describe(h), "params": n_params(h),
                "file_bytes": path.stat().st_size, "train_steps": summary["steps"],
                "train_s": summary["train_s"], "acceptance": measure_pair(models / TARGET_FILE, path, prompts, new)}


def measure(a) -> dict:
    tok = Tokenizer.of_models(a.models)
    stories = heldout_stories(a.models / "heldout.txt")
    if len(stories) < LOSS_STORIES.stop:
        raise ValueError("%s holds %d stories, the loss figures need %d: restore it (git checkout models/heldout.txt)"
                         % (a.models / "heldout.txt", len(stories), LOSS_STORIES.stop))
    ref = read_reference(a.models / "reference.npz")
    loss_ids = [tok.encode(stories[i])[:512] for i in LOSS_STORIES]
    out: dict = {"models": {}}
    for name in ("drafter", "target", HOST_DRAFTER_FILE.removesuffix(".spm")):
        path = a.models / (name + ".spm")
        h = Engine(path).header
        out["models"][name] = {
            "shape": describe(h), "vocab": h.vocab, "max_seq": h.max_seq, "params": n_params(h),
            "file_bytes": path.stat().st_size, "kv_bytes": kv_bytes(h, h.max_seq),
            "loss_int8": int8_loss(path, loss_ids)} | (
            {"loss_float": float(ref[name + ".float_loss"])} if name + ".float_loss" in ref else {})
    prompts = heldout_prompts(a.models, tok, a.prompts)
    t0 = time.time()
    out["acceptance"] = measure_pair(a.models / TARGET_FILE, a.models / DRAFTER_FILE, prompts, a.new)
    out["acceptance_setup"] = {"gamma": GAMMA, "prompts": len(prompts), "prompt_tokens": PROMPT_TOKENS,
                               "new_tokens": a.new, "seconds": round(time.time() - t0, 1)}
    out["acceptance_by_set"] = {
        name: {set_name: measure_pair(a.models / TARGET_FILE, a.models / name,
                                      prompt_set(set_name, a.models, tok, a.prompts), a.new) for set_name in PROMPT_SETS}
        for name in (ESP32S3.drafter, ESP32.drafter, HOST_DRAFTER_FILE)}
    out["variants"] = [variant(Path(ck), a.models, prompts, a.new) for ck in a.variants]
    out["loss_setup"] = {"stories": len(loss_ids), "tokens": sum(len(i) - 1 for i in loss_ids)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specmesh.tools.modelcard", description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=a_path, default=MODELS,  # the package's, wherever it is run from
                    help="the models folder measured (default: the shipped models/)")
    ap.add_argument("--prompts", type=int, default=64,
                    help="acceptance prompts: the first N of each held-out set" + DEFAULT)
    ap.add_argument("--new", type=int, default=96, help="tokens generated after each prompt" + DEFAULT)
    ap.add_argument("--variants", type=a_path, nargs="*", default=[], help="drafter checkpoint folders to compare")
    ap.add_argument("--json", type=a_path, default=Path("runs/modelcard.json"), help="the figures' file" + DEFAULT)
    a = ap.parse_args(argv)
    try:  # no prompts or no new tokens measure nothing: a division by zero after minutes of measuring
        in_range("--prompts", a.prompts, 1)
        in_range("--new", a.new, 1)
    except RangeError as e:
        print("modelcard: %s" % e, file=sys.stderr)
        return 2
    problem = models_folder_problem(a.models)
    if problem:  # was its first file's "No such file or directory", which did not say the folder was the typo
        print("modelcard: %s" % problem, file=sys.stderr)
        return 2
    if a.variants and importlib.util.find_spec("torch") is None:  # exporting them needs it: said before measuring
        from specmesh.host.backends.torch_backend import INSTALL_HINT

        print("modelcard: --variants: %s" % INSTALL_HINT, file=sys.stderr)
        return 1
    lacking = [ck / f for ck in a.variants for f in ("summary.json", "best.pt") if not (ck / f).is_file()]
    if lacking:  # said before the minutes of measuring the shipped models, not after them
        print("modelcard: --variants: no %s: give checkpoint folders of tools/train.py" % lacking[0], file=sys.stderr)
        return 1
    try:
        check_variants(a.variants)
    except (OSError, ValueError) as e:  # CheckpointError is a ValueError
        print("modelcard: --variants: %s" % said(e), file=sys.stderr)
        return 1
    problem = output_problem(a.json, [*a.models.glob("*"), *(f for ck in a.variants for f in ck.glob("*"))])
    if problem:
        print("modelcard: --json %s cannot be written: %s" % (a.json, problem), file=sys.stderr)
        return 2
    try:
        figures = measure(a)
    except (OSError, KeyError, ValueError, BackendError, ModelFileError, TokenizerError) as e:
        print("modelcard: %s" % said(e), file=sys.stderr)
        return 1
    try:  # the Unix way: a device or a FIFO is written to, never replaced by a file
        atomic.write_output(a.json, json.dumps(figures, indent=1))
    except STDOUTS:  # `--json -`: said as stdout's (a reader that left: quietly)
        raise
    except OSError as e:
        print("modelcard: cannot write %s: %s" % (a.json, e.strerror), file=sys.stderr)
        return 1
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    run_tool("modelcard", main)
