"""The held-out stories of models/heldout.txt and what each range of them is for: checkpoint selection
(tools/train.py), the loss figures (tools/export.py, tools/modelcard.py) and the acceptance prompts.
One home for the split, below both the exporter and the model card."""

from __future__ import annotations

from pathlib import Path

from specmesh.host.decode.tokenizer import Tokenizer

# models/heldout.txt by story number: 0..63 select checkpoints (tools/train.py), 64..127 give the loss
# figures (tools/export.py saves the float model's), 128 on are the acceptance prompts
LOSS_STORIES = range(64, 128)
FIRST_STORY = 128
PROMPT_TOKENS = 16


def heldout_stories(path: Path) -> list[str]:
    """The held-out stories (blank-line separated) of models/heldout.txt."""
    return [s.strip() for s in path.read_text("utf-8").split("\n\n") if s.strip()]


def heldout_prompts(models: Path, tok: Tokenizer, n: int) -> list[list[int]]:
    """The first PROMPT_TOKENS tokens of n acceptance stories (from FIRST_STORY, long enough)."""
    ids = (tok.encode(s) for s in heldout_stories(models / "heldout.txt")[FIRST_STORY:])
    return [i[:PROMPT_TOKENS] for i in ids if len(i) >= PROMPT_TOKENS][:n]
