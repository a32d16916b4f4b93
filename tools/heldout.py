"""The held-out prompts and what each set of them is for: one home for the split, below the trainer, the
exporter, the model card and the benches.

Two disjoint sets of different sources (issue 30's protocol: tune on the first, report the second):

- `tinystories`, the tuning set: models/heldout.txt, stories of the TinyStories validation split. By
  story number: 0..63 select checkpoints (tools/train.py), 64..127 give the loss figures
  (tools/export.py saves the float model's), 128 on are the acceptance prompts (their first
  PROMPT_TOKENS tokens), on which the model card's alphas and gamma's prior weight and its decay were chosen.
- `handwritten`, the report set: models/heldout_handwritten.txt, short story starts written by hand for
  this project, one a line, each whole as the prompt. No model was trained, no checkpoint chosen and no
  constant tuned on them: they are only measured.

Run, it prints each set's first prompts as text, one a line, under a `#` line saying what the set is (a prompt
for `specmesh run -p`, as the benches' figures were measured on):

    python -m specmesh.tools.heldout [--set tinystories|handwritten] [--prompts 8]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from specmesh.host.cli.ranges import RangeError, in_range
from specmesh.host.decode.tokenizer import Tokenizer
from specmesh.host.layout import MODELS
from specmesh.tools import run_tool

LOSS_STORIES = range(64, 128)
FIRST_STORY = 128
PROMPT_TOKENS = 16
HANDWRITTEN = "heldout_handwritten.txt"
PROMPT_SETS = ("tinystories", "handwritten")  # the tuning set first, then the report set
ABOUT = {"tinystories": "the tuning set (the first %d tokens of TinyStories validation stories, models/heldout.txt)"
                        % PROMPT_TOKENS,
         "handwritten": "the report set (hand-written story starts, models/%s: nothing trained, chosen or tuned on "
                        "them)" % HANDWRITTEN}


def _text(path: Path) -> str:
    """`path`'s text; a file that is not UTF-8 is a ValueError naming it (the decoder's own names no file)."""
    try:
        return path.read_text("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError("%s is not UTF-8 text (byte %d): restore it (git checkout models/%s)" % (path, e.start, path.name)) from None


def heldout_stories(path: Path) -> list[str]:
    """The held-out stories (blank-line separated) of models/heldout.txt."""
    return [s.strip() for s in _text(path).split("\n\n") if s.strip()]


def heldout_prompts(models: Path, tok: Tokenizer, n: int) -> list[list[int]]:
    """The first PROMPT_TOKENS tokens of n acceptance stories (from FIRST_STORY, long enough)."""
    ids = (tok.encode(s) for s in heldout_stories(models / "heldout.txt")[FIRST_STORY:])
    return [i[:PROMPT_TOKENS] for i in ids if len(i) >= PROMPT_TOKENS][:n]


def handwritten_prompts(models: Path, tok: Tokenizer, n: int | None = None) -> list[list[int]]:
    """The hand-written story starts (the report set), each line whole from BOS; the first n, or all."""
    lines = [s.strip() for s in _text(models / HANDWRITTEN).splitlines() if s.strip()]
    return [tok.encode(s) for s in lines[:n]]


def prompt_set(name: str, models: Path, tok: Tokenizer, n: int) -> list[list[int]]:
    """The first n prompts of the set `name` (PROMPT_SETS)."""
    if name == "tinystories":
        return heldout_prompts(models, tok, n)
    if name == "handwritten":
        return handwritten_prompts(models, tok, n)
    raise ValueError("unknown prompt set %r (sets: %s)" % (name, ", ".join(PROMPT_SETS)))


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m specmesh.tools.heldout", description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=PROMPT_SETS, help="print this set only (default: both)")
    ap.add_argument("--prompts", type=int, default=8, help="the first N prompts of each set (default 8: the "
                    "projection bench's)")
    a = ap.parse_args(argv)
    try:
        in_range("--prompts", a.prompts, 1)
    except RangeError as e:
        ap.exit(2, "heldout: %s\n" % e)
    tok = Tokenizer.from_llama2c(MODELS / "tokenizer.bin")
    for name in [a.set] if a.set else PROMPT_SETS:
        try:
            prompts = prompt_set(name, MODELS, tok, a.prompts)
        except ValueError as e:  # a prompt file that is not UTF-8 (it names the file and what to do)
            ap.exit(1, "heldout: %s\n" % e)
        print("# %s, %s: its first %d prompt%s, one a line" % (name, ABOUT[name], len(prompts),
                                                             "" if len(prompts) == 1 else "s"))
        for p in prompts:
            print(tok.decode(p))


if __name__ == "__main__":
    run_tool("heldout", main)
