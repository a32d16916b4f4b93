"""What `specmesh flash` says about the shipped drafter a board gets when no --model is named: which, where
its weights live, and what it costs in acceptance against the widest. Which drafter a board class runs is
host/boardclasses.py's (`BoardClass.drafter`: drafter-esp32.spm from a classic ESP32's heap, stock firmware
included, drafter.spm in an S3's PSRAM); the figures are the model card's, read from its data file
models/card.json (gamma 4, q-hat of 8, 64 held-out stories; models/MODEL_CARD.md renders the same file). The target decides every token, so either drafter gives the same text: the smaller one
costs speed, never output.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specmesh.host.boardclasses import ESP32, ESP32S3
from specmesh.host.layout import MODELS

CARD = MODELS / "card.json"


@dataclass(frozen=True)
class ShippedDrafter:
    file: str
    width: int
    alpha_greedy: float  # alpha at T = 0
    per_verification: float  # tokens per verification at T = 0
    alpha_sampled: float  # alpha at T = 1

    def acceptance(self) -> str:
        return "alpha %.3f greedy (%.2f tokens per verification), %.3f at T = 1" % (
            self.alpha_greedy, self.per_verification, self.alpha_sampled)


def shipped(card: dict) -> dict[str, ShippedDrafter]:
    """File name -> its figures, for each drafter of the model card's data (models/card.json's layout)."""
    return {name: ShippedDrafter(name, d["width"], d["greedy"]["alpha"], d["greedy"]["tokens_per_verification"],
                                 d["sampled"]["alpha"]) for name, d in card["drafters"].items()}


def read_card(path: Path) -> tuple[dict[str, ShippedDrafter], str | None]:
    """The drafters of the model card's data at `path`, and None; or none and the line that says why it cannot be read
    (a damaged or replaced models/card.json failed every specmesh command on import, with a KeyError's traceback): run
    and flash refuse to start with it (`UNREADABLE`), the commands that never read it work on."""
    try:
        return shipped(json.loads(path.read_text())), None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else "%s %s" % (type(e).__name__, e)
        return {}, ("%s, the model card's data, cannot be read (%s): restore it (`git checkout models/card.json` in a "
                    "checkout of specmesh, else install specmesh again)" % (path, why))


SHIPPED, UNREADABLE = read_card(CARD)
WIDE = SHIPPED.get(ESP32S3.drafter)  # the widest: what an S3 runs from PSRAM
HEAP = SHIPPED.get(ESP32.drafter)  # what a classic ESP32 runs from its heap


def expected_alpha(name: str, greedy: bool) -> float | None:
    """The model card's acceptance of the shipped drafter file `name`, greedy or sampled (its T = 1 figure
    for any T > 0), None for a drafter it did not measure: gamma auto's prior (host/decode/gamma.py expect)."""
    drafter = SHIPPED.get(name)
    if drafter is None:
        return None
    return drafter.alpha_greedy if greedy else drafter.alpha_sampled


def describe(name: str, where: str) -> str:
    """The line flash prints for the drafter file `name` it chose, placed `where` (a few words)."""
    drafter = SHIPPED.get(name)
    if drafter is None:  # a models folder of one drafter: every board runs that one
        return "drafter model %s (%s)" % (name, where)
    line = "drafter model %s (%d wide; %s): %s" % (drafter.file, drafter.width, where, drafter.acceptance())
    if WIDE is not None and drafter is not WIDE:
        line += "; %s would give %s" % (WIDE.file, WIDE.acceptance())
    return line
