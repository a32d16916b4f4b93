"""`make train`: distil the drafter from the shipped target, export it, measure the model card figures.

The target (models/target.spm, llama2.c's stories260K) is shipped and never retrained; the drafter
learns from stories the target samples itself, so nothing outside the repository is needed. Training
resumes from checkpoints/drafter/last.pt; its data, batches and schedule are pure functions of the seed
and the step, so a re-run rebuilds the same drafter.

    python -m tools.train_all
"""

from __future__ import annotations

import sys
from pathlib import Path

from tools import export, modelcard, train

CK = Path("checkpoints") / "drafter"
SHAPE = "d48l2kv1"  # the shipped drafter's shape (models/MODEL_CARD.md compares the others)
DRAFTER = ["--shape", SHAPE, "--out", str(CK), "--steps", "3000"]  # ~30 min on 2 cores; no time budget, so
# the learning-rate schedule, and with it the drafter, does not depend on the machine's speed


def main(argv: list[str] | None = None) -> int:
    if train.main(DRAFTER):
        return 1
    if export.main(["--model", "drafter=%s" % (CK / "best.pt")]):
        return 1
    return modelcard.main([])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
