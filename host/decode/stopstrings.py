"""Stop strings (`specmesh run --stop`, llama.cpp's reverse prompts): where the generated text ends, and
how much of it may be shown while a stop string could still be forming across the next tokens.

The text ends just before the first occurrence of any stop string (the stop string is not shown). The
search covers the generated text only, never the prompt.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopStrings:
    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]

    def __bool__(self) -> bool:
        return bool(self.stops)

    def cut(self, text: str) -> int | None:
        """Where `text` ends: the index of the first stop string in it, or None when it holds none."""
        found = [i for i in (text.find(s) for s in self.stops) if i >= 0]
        return min(found) if found else None

    def showable(self, text: str) -> int:
        """How much of `text` (holding no stop string) can be shown now: all but its longest ending that
        begins a stop string, which the next tokens may complete."""
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(text)), hold, -1):
                if text.endswith(s[:n]):
                    hold = n
                    break
        return len(text) - hold
