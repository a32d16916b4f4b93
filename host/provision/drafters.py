"""The shipped drafters, and which one `specmesh flash` gives a board when no --model is named.

- models/drafter.spm, 64 wide (102,720 parameters, 109,612 bytes): its weights need no heap where the
  board reads them in place from a ROMFS partition, or where PSRAM holds them (an ESP32-S3);
- models/drafter-heap.spm, 40 wide (51,720 parameters, 57,068 bytes): the drafter shipped before ROMFS,
  whose weights and engine fit a stock classic ESP32's heap (the stock MicroPython downloads have no
  ROMFS partition), with a 128-position context there (firmware/node.py halves it on a tight heap).

Their acceptance is models/MODEL_CARD.md's (gamma 4, q-hat of 8, 64 held-out stories); the target decides
every token, so either drafter gives the same text, and the smaller one costs speed, never output.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specmesh.host.layout import DRAFTER_FILE, MODELS


@dataclass(frozen=True)
class ShippedDrafter:
    file: str
    width: int
    alpha_greedy: float  # alpha at T = 0
    per_verification: float  # tokens per verification at T = 0
    alpha_sampled: float  # alpha at T = 1

    def path(self, folder: Path = MODELS) -> Path:
        return folder / self.file

    def acceptance(self) -> str:
        return "alpha %.3f greedy (%.2f tokens per verification), %.3f at T = 1" % (
            self.alpha_greedy, self.per_verification, self.alpha_sampled)


WIDE = ShippedDrafter(DRAFTER_FILE, 64, 0.841, 3.60, 0.705)
HEAP = ShippedDrafter("drafter-heap.spm", 40, 0.788, 3.20, 0.616)


def choose(psram: bool, romfs_fits: bool, no_romfs: bool = False) -> tuple[ShippedDrafter, str]:
    """The drafter for a board, and where its weights live (a few words for the user); `no_romfs`: the
    user kept the model out of the board's ROMFS partition (flash --no-romfs). Without PSRAM the wide
    drafter's 110 KB of weights never fit the heap beside its engine (a classic ESP32 has 110,536 bytes),
    so the heap's free bytes, which a probe reads before the node's code is loaded, do not decide."""
    if psram:
        return WIDE, "weights in PSRAM"
    if romfs_fits:
        return WIDE, "weights read in place from the ROMFS partition"
    why = "--no-romfs" if no_romfs else "this board has no ROMFS partition that holds %s" % WIDE.file
    return HEAP, "weights and engine in the heap: %s" % why


def describe(drafter: ShippedDrafter, where: str) -> str:
    """What `specmesh flash` says about the drafter it chose: which, where, and what it costs."""
    line = "drafter model %s (%d wide; %s): %s" % (drafter.file, drafter.width, where, drafter.acceptance())
    if drafter is not WIDE:
        line += ("; %s would give %s from a MicroPython with a ROMFS partition (README: the ROMFS build)"
                 % (WIDE.file, WIDE.acceptance()))
    return line
