"""`make train`: distil the three shipped drafters from the shipped target, export them, build the classic ESP32
drafter's n-gram table (tools/ngram.py: the target's own greedy continuations), measure the model card.

The target (models/target.spm, llama2.c's stories260K) is shipped and never retrained; each drafter
learns from stories the target samples itself and from TinyStories paragraphs
(models/tinystories_train_head.txt), so nothing outside the repository is needed. Phases each resume
from their checkpoints/<drafter>/<phase>/last.pt:

1. `kl`: KL to the target's distributions (5,000 steps; drafter-host.spm 3,000 from four of the target's
   five layers, 0, 1, 2 and 4, at a third of the learning rate, its checkpoint chosen by greedy acceptance);
2. `tv`: the total variation to the drafter's q-hat, 1 - alpha at T = 1 (1,000 steps), from kl's best;
3. `accept` (drafter-esp32.spm; issue 30): from tv's best as the int8 file it exports to, the first 400
   steps of a 600-step schedule at a low learning rate, on pools that are half the target's greedy
   continuations of TinyStories openings, half its T = 1 samples, a quarter of the rows TinyStories text
   itself, with acceptance-shaped losses (DistillSpec, Zhou et al. 2023): the q-hat total variation, the
   drafter's log-probability of the target's greedy token (a smooth alpha at T = 0) and half the KL. The
   checkpoint with the best greedy acceptance on the tuning prompts (tools/heldout.py) continued greedily is
   kept. The same phase on drafter.spm did not beat it (models/MODEL_CARD.md), so drafter.spm ends after `tv`;
4. `accept-long` (drafter-esp32.spm): the same losses and data for 3,000 steps from accept's file.

Data, batches and schedules are pure functions of the seed and the step (no time budget: the
learning-rate schedule does not depend on the machine's speed), so a re-run rebuilds the same drafters
on the same software, about two and three-quarter hours on 2 cores (the table a quarter of an hour).

    python -m specmesh.tools.train_all
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specmesh.host.layout import MODELS
from specmesh.tools import run_tool, without_torch

try:
    from specmesh.tools import export, modelcard, ngram, train
except ImportError as e:  # PyTorch, the `gpu` extra
    without_torch(e, __name__)

CK = Path("checkpoints")
OPENINGS = str(MODELS / "tinystories_train_head.txt")
# the acceptance phases' data and losses
ACCEPTANCE = ["--pool", "512", "--refresh", "100", "--lr", "5e-4", "--warmup", "20", "--temps", "0,1", "--openings",
              OPENINGS, "--text-share", "0.25", "--loss", "kl:0.5,tv:1,greedy:1", "--select", "alpha_greedy"]
ACCEPT = ["--steps", "600", "--stop-at", "400", "--eval-every", "100"] + ACCEPTANCE
# the same for 3,000 steps, from the accept phase's file: greedy agreement on the tuning prompts went on rising to
# about step 2,000 (0.795 -> 0.808, teacher-forced; models/MODEL_CARD.md)
ACCEPT_LONG = ["--steps", "3000", "--eval-every", "200"] + ACCEPTANCE
# drafter file -> (shape, its kl and tv phases' data, the kl phase's own arguments, the acceptance phases that
# follow, each from the file the phase before exports): drafter.spm trains on pools opening with TinyStories text;
# drafter-esp32.spm (40 wide, heads of 8) as a9c3511's 40-wide drafter did, then two acceptance phases;
# drafter-host.spm (the host's, `--drafter cpu`) starts from four of the target's five layers, so a short kl
# phase at a lower learning rate suffices
RECIPES = {
    "drafter": ("d64l2kv1", ["--temps", "1,0.3", "--openings", OPENINGS], ["--steps", "5000"], []),
    "drafter-esp32": ("d40l2h5kv1", ["--temps", "1,0.3"], ["--steps", "5000"],
                      [("accept", ACCEPT), ("accept-long", ACCEPT_LONG)]),
    "drafter-host": ("t64l4", ["--temps", "1,0.3", "--openings", OPENINGS, "--threads", "2"],
                     ["--steps", "3000", "--init-layers", "0,1,2,4", "--lr", "1e-3", "--warmup", "20",
                      "--select", "alpha_greedy"], []),
}


def phases(name: str) -> list[list[str]]:
    """The train.py arguments of each phase of drafter `name`, in order."""
    shape, data, kl, accept = RECIPES[name]
    ck = CK / name
    return [
        ["--shape", shape, "--out", str(ck / "kl")] + kl + data,
        ["--shape", shape, "--out", str(ck / "tv"), "--steps", "1000", "--loss", "tv", "--lr", "5e-4",
         "--warmup", "20", "--init", str(ck / "kl" / "best.pt")] + data,
    ] + [["--shape", shape, "--out", str(ck / out), "--init", str(ck / (before + ".spm"))] + args
         for before, (out, args) in zip(["tv"] + [out for out, _ in accept], accept)]


def main(argv: list[str] | None = None) -> int:
    # no options: `--help` or a stray argument must not start hours of training
    argparse.ArgumentParser(prog="python -m specmesh.tools.train_all", description=__doc__.split("\n\n")[0]
                            ).parse_args(argv)
    tid = export.tokenizer_id_of(MODELS)  # a vocab.bin of another tokenizer: one line, before hours of training
    best = {}
    for name in RECIPES:
        steps = phases(name)
        for phase in steps:
            init = Path(phase[phase.index("--init") + 1]) if "--init" in phase else None
            if init is not None and init.suffix == ".spm":  # an acceptance phase: the int8 file the one before exports
                export.export_model(export.load_float(init.with_suffix("") / "best.pt"), init, tid)
            if train.main(phase):
                return 1
        best[name] = Path(steps[-1][steps[-1].index("--out") + 1]) / "best.pt"
    # drafter.spm with its reference outputs (models/reference.npz); the others the file alone
    if export.main(["--model", "drafter=%s" % best["drafter"]]):
        return 1
    for name in ("drafter-esp32", "drafter-host"):
        export.export_model(export.load_float(best[name]), MODELS / (name + ".spm"), tid)
    if ngram.main([]):  # each board drafter's table, beside it
        return 1
    return modelcard.main([])


if __name__ == "__main__":
    run_tool("train_all", lambda: main(sys.argv[1:]))
