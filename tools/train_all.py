"""`make train`: distil the drafter from the shipped target, export it, measure the model card figures.

The target (models/target.spm, llama2.c's stories260K) is shipped and never retrained; the drafter
learns from stories the target samples itself, each opening with a few tokens of a TinyStories paragraph
(models/tinystories_train_head.txt), so nothing outside the repository is needed. Training
has two phases (KL to the target's distributions, then their total variation), each resuming from its
checkpoints/drafter/<phase>/last.pt; data, batches and schedule are pure functions of the seed and the
step, so a re-run rebuilds the same drafter (about an hour on 2 cores).

    python -m specmesh.tools.train_all
"""

from __future__ import annotations

import sys
from pathlib import Path

from specmesh.tools import export, modelcard, train

CK = Path("checkpoints") / "drafter"
SHAPE = "d64l2kv1"  # the shipped drafter's shape (models/MODEL_CARD.md compares the others)
# Step counts, no time budget, so the learning-rate schedule, and with it the drafter, does not depend on
# the machine's speed. Pools: half sampled at T = 1, half cooler (T = 0.3), each row opening with 4-48
# tokens of a real TinyStories paragraph (the text after a user's prompt, where acceptance is measured).
DATA = ["--shape", SHAPE, "--temps", "1,0.3", "--openings", "models/tinystories_train_head.txt"]
KL = DATA + ["--out", str(CK / "kl"), "--steps", "5000"]
# then the total variation (1 - alpha at T = 1) from the KL phase's best, where KL flattens
TV = DATA + ["--out", str(CK / "tv"), "--steps", "1000", "--loss", "tv", "--lr", "5e-4", "--warmup", "20",
             "--init", str(CK / "kl" / "best.pt")]


def main(argv: list[str] | None = None) -> int:
    for phase in (KL, TV):
        if train.main(phase):
            return 1
    if export.main(["--model", "drafter=%s" % (CK / "tv" / "best.pt")]):
        return 1
    return modelcard.main([])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
