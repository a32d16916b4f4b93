"""Export float models to specmesh model files (int8 per row) plus their reference outputs.

A model comes from a distillation checkpoint (`tools/train.py`, `.pt`) or a llama2.c checkpoint (`.bin`,
as stories260K, the target, was imported once). models/<name>.spm is written with host/backends/modelio.py; the
header's tokenizer id is the CRC-32 of models/vocab.bin, which must be models/tokenizer.bin's table (tokenizer_id_of:
one of another tokenizer is refused). models/reference.npz keeps, for each exported model, the float model's outputs
on held-out stories (models/heldout.txt), so tests and the model card check the int8 engines against the float model
without PyTorch or the float checkpoint:
    <name>.tokens int32 [P, T]: held-out story prompts, <name>.logits float16 [P, T, vocab],
    <name>.prompt int32 [P, G0], <name>.greedy int32 [P, G] (float greedy tokens after the prompt),
    <name>.margin float32 [P, G] (float top-1 minus top-2 logit at each greedy step: near-ties show),
    <name>.float_loss float64 [] (held-out loss of the float model on the model card's loss stories).
Entries of models not exported in this call are kept. Every model's reference outputs are computed before any file
is written: a Ctrl-C while they are leaves the folder as it was. --out (default: models/) is a models folder:
export reads vocab.bin, tokenizer.bin and heldout.txt there and writes the models beside them.

    python -m specmesh.tools.export --model drafter=checkpoints/drafter/best.pt
    python -m specmesh.tools.export --model target=stories260K.bin
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np
from specmesh.tools import run_tool, said, without_torch

try:
    import torch
except ImportError as e:  # the `gpu` extra
    without_torch(e, __name__)

from specmesh.host import atomic
from specmesh.host.backends.modelio import check_config, write_model
from specmesh.host.cli.flags import a_path
from specmesh.host.cli.preflight import tokenizer_id
from specmesh.host.decode.tokenizer import Tokenizer, TokenizerError, vocab_id
from specmesh.host.layout import MODELS
from specmesh.shared.modelfile import FLAG_SHARED_CLS, MAGIC, Header
from specmesh.tools.llama2c_import import ImportError_, read_checkpoint
from specmesh.tools.modeldefs import CheckpointError, ModelArgs, Transformer, export_tensors, from_tensors, load_weights, read_pt
from specmesh.tools.heldout import LOSS_STORIES, heldout_stories
from specmesh.tools.reference import read_reference

REF_PROMPTS = 3
REF_LEN = 64  # teacher-forced positions with saved logits
GREEDY_PROMPT = 16
GREEDY_NEW = 24
READ_IN_OUT = ("vocab.bin", "tokenizer.bin", "heldout.txt")  # what export reads in --out


def tokenizer_id_of(models: Path) -> int:
    """The tokenizer id the models exported into the folder `models` name in their headers: the CRC of its vocab.bin
    (the table a board decodes with), checked to be the table of its tokenizer.bin (the host's, which the models are
    trained and measured with). A vocab.bin of another tokenizer gave models whose headers named that one, and a run
    refused them with their own tokenizer.bin (host/cli/preflight.py check_tokenizer)."""
    tid = vocab_id((models / "vocab.bin").read_bytes())
    if tokenizer_id(Tokenizer.of_models(models)) != tid:
        raise TokenizerError("%s is not the vocab table of %s (it is another tokenizer's): the models' headers would "
                             "name the wrong tokenizer; put the vocab.bin of this tokenizer beside it (llama2c_import "
                             "--tokenizer writes it; git checkout models/vocab.bin models/tokenizer.bin restores the "
                             "shipped pair)" % (models / "vocab.bin", models / "tokenizer.bin"))
    return tid


def header_of(model: Transformer, tokenizer_id: int) -> Header:
    a = model.a
    return Header(a.dim, a.n_layers, a.n_heads, a.n_kv_heads, a.hidden, a.vocab, a.max_seq,
                  flags=FLAG_SHARED_CLS if a.shared_cls else 0, tokenizer_id=tokenizer_id,
                  norm_eps=a.norm_eps, rope_theta=a.rope_theta)


def export_model(model: Transformer, path: Path, tokenizer_id: int) -> Header:
    """Write `model` as an int8 model file; returns the written header."""
    return write_model(path, header_of(model, tokenizer_id), export_tensors(model))


def load_float(path: Path) -> Transformer:
    """The float model of a distillation checkpoint (.pt) or a llama2.c checkpoint (.bin)."""
    if path.suffix == ".pt":
        ck = read_pt(path)
        try:
            m = Transformer(ModelArgs(**ck["config"]))
        except TypeError:  # a config of other names: no ModelArgs
            raise CheckpointError("%s holds a config that is not a model's: give a .pt that tools/train.py wrote"
                                  % path) from None
        load_weights(m, ck["model"], str(path), "its own config", "give a .pt that tools/train.py wrote")
        return m.eval()
    data = path.read_bytes()
    if data.startswith(MAGIC):  # read as a llama2.c header: "implausible llama2.c header {...}", and no way on
        raise CheckpointError("%s is a specmesh model file, exported already: give the checkpoint to export, a .pt "
                              "that tools/train.py wrote or a llama2.c .bin" % path)
    try:
        cfg, tensors = read_checkpoint(data)
    except ImportError_ as e:  # its message names no file
        raise CheckpointError("%s: %s" % (path, e)) from None
    return from_tensors(ModelArgs(dim=cfg["dim"], n_layers=cfg["n_layers"], n_heads=cfg["n_heads"],
                                  n_kv_heads=cfg["n_kv_heads"], hidden=cfg["hidden"], vocab=cfg["vocab"],
                                  max_seq=cfg["max_seq"], shared_cls=cfg["shared_cls"]), tensors)


def story_tokens(tok: Tokenizer, stories: list[str], length: int, n: int) -> np.ndarray:
    """The first `length` tokens (BOS included) of n held-out stories at least that long, spread evenly."""
    long = [ids[:length] for ids in (tok.encode(s) for s in stories) if len(ids) >= length]
    return np.array([long[int(j)] for j in np.linspace(0, len(long) - 1, n)], np.int32)


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
def float_loss(model: Transformer, tok: Tokenizer, stories: list[str]) -> float:
    """Mean next-token loss (nats) of the float model over the stories, each from its BOS."""
    tot = n = 0
    for s in stories:
        x = torch.tensor([tok.encode(s)[:model.a.max_seq]])
        tot += float(torch.nn.functional.cross_entropy(model(x[:, :-1])[0], x[0, 1:], reduction="sum"))
        n += x.shape[1] - 1
    return tot / n


@torch.no_grad()
def reference(name: str, m: Transformer, tok: Tokenizer, stories: list[str]) -> dict[str, np.ndarray]:
    toks = story_tokens(tok, stories, REF_LEN, REF_PROMPTS)
    runs = [greedy(m, p, GREEDY_NEW) for p in toks[:, :GREEDY_PROMPT]]
    return {name + ".tokens": toks,
            name + ".logits": m(torch.from_numpy(toks.astype(np.int64))).numpy().astype(np.float16),
            name + ".prompt": toks[:, :GREEDY_PROMPT],
            name + ".greedy": np.array([r[0] for r in runs], np.int32),
            name + ".margin": np.array([r[1] for r in runs], np.float32),
            name + ".float_loss": np.float64(float_loss(m, tok, [stories[i] for i in LOSS_STORIES]))}


def _check_out(out: Path) -> None:
    """ValueError where `out` is no models folder: export reads the vocabulary, tokenizer and held-out stories there,
    beside the model files it writes (a new folder said only "OUT/vocab.bin: No such file or directory")."""
    missing = [name for name in READ_IN_OUT if not (out / name).is_file()]
    if not out.is_dir() or missing:
        raise ValueError("--out %s %s: give a models folder (models/, or a copy of it): export reads %s there and "
                         "writes the models beside them" % (out, "has no " + ", ".join(missing) if out.is_dir()
                                                            else "is not a folder", ", ".join(READ_IN_OUT)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specmesh.tools.export", description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", required=True, metavar="NAME=CHECKPOINT",
                    help="a checkpoint to export as NAME.spm in --out: a .pt of tools/train.py or a llama2.c .bin "
                         "(repeatable)")
    ap.add_argument("--out", type=a_path, default=MODELS,  # the package's, wherever it is run from
                    help="a models folder: its vocab.bin, tokenizer.bin and heldout.txt are read, the models and "
                         "reference.npz written there (default: the shipped models/)")
    a = ap.parse_args(argv)
    try:
        _check_out(a.out)
        tid = tokenizer_id_of(a.out)
        tok = Tokenizer.of_models(a.out)
        stories = heldout_stories(a.out / "heldout.txt")
        models = {}
        for spec in a.model:
            name, _, ck = spec.partition("=")
            if not ck:
                raise ValueError("--model wants NAME=CHECKPOINT, got %r" % spec)
            # "../x" wrote outside --out; a.b's reference entries went with the next export of a (its keys "a.*")
            if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
                raise ValueError("--model %s: NAME must be letters, digits, - and _ only (as drafter-esp32): it becomes "
                                 "the file NAME.spm in --out" % spec)
            if name in models:  # the last given was kept, unsaid
                raise ValueError("--model %s: %s is named twice (one checkpoint a NAME: each becomes NAME.spm)"
                                 % (spec, name))
            models[name] = load_float(Path(ck))
            if models[name].a.max_seq < REF_LEN:  # torch's "size of tensor a must match" traceback, in reference()
                raise ValueError("--model %s: its context holds %d positions, export's reference outputs need %d: give "
                                 "a checkpoint of max_seq %d or more" % (spec, models[name].a.max_seq, REF_LEN,
                                                                         REF_LEN))
            # said before the minutes of its reference outputs, as every other refusal here: not once they are computed
            check_config(a.out / (name + ".spm"), header_of(models[name], tid))
            problem = atomic.unwritable(a.out / (name + ".spm"))  # a folder there: the models before it were written
            if problem:
                raise ValueError("model %s cannot be written: %s" % (a.out / (name + ".spm"), problem))
        ref_path = a.out / "reference.npz"
        refs = read_reference(ref_path) if ref_path.exists() else {}
    except (OSError, ValueError, TokenizerError) as e:  # CheckpointError is a ValueError
        print("export: %s" % said(e), file=sys.stderr)
        return 1
    for name, m in models.items():
        refs = {k: v for k, v in refs.items() if not k.startswith(name + ".")} | reference(name, m, tok, stories)
    # the files once every model's reference outputs are computed (minutes): a Ctrl-C meanwhile left a model file new
    # and its reference outputs old, which the tests check the int8 engines against; now it leaves --out as it was
    for name, m in models.items():
        path = a.out / (name + ".spm")
        export_model(m, path, tid)
        print("export: %s  %d params  %d bytes" % (path, m.n_params(), path.stat().st_size))
    with atomic.replacing(ref_path) as f:  # a Ctrl-C while it is written keeps the old archive whole
        np.savez_compressed(f, **refs)
    print("export: %s" % ref_path)
    return 0


if __name__ == "__main__":
    run_tool("export", main)
