"""`make train`: corpus -> tokenizer -> target -> distilled drafter -> export -> figures, resumably.

Every stage is skipped when its output exists (the corpus, models/tokenizer.json: retraining the
tokenizer would invalidate every model) or resumes from its checkpoint (training); the seeds are
fixed, so a re-run rebuilds the same data and batches. Training stops at its step count or time
budget, whichever comes first (the learning-rate schedule follows whichever is further along).

    python -m tools.train_all
"""

from __future__ import annotations

import sys
from pathlib import Path

from tools import corpus, export, modelcard, tokenizer, train

CK = Path("checkpoints")
TARGET = ["--config", "target", "--out", str(CK / "target"), "--steps", "3000", "--minutes", "55", "--lr", "2e-3"]
DRAFTER = ["--config", "drafter", "--out", str(CK / "drafter"), "--teacher", str(CK / "target" / "best.pt"),
           "--steps", "4000", "--minutes", "25", "--lr", "3e-3"]


def main(argv: list[str] | None = None) -> int:
    if not Path("corpus/train.txt").exists() and corpus.main([]):
        return 1
    if not Path("models/tokenizer.json").exists() and tokenizer.main([]):
        return 1
    for args in (TARGET, DRAFTER):
        if train.main(args):
            return 1
    if export.main(["--model", "target=%s" % (CK / "target" / "best.pt"),
                    "--model", "drafter=%s" % (CK / "drafter" / "best.pt")]):
        return 1
    return modelcard.main([])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
