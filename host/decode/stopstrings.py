"""Stop strings (`specmesh run --stop`, llama.cpp's reverse prompts): where the generated text ends, and
how much of it may be shown while a stop string could still be forming across the next tokens.

The text ends just before the first occurrence of any stop string (the stop string is not shown). The
search covers the generated text only, never the prompt. `StopScan` decides it once per stream, as the
tokens arrive: each token's bytes are decoded once, and only the text they add (with the few characters
before it that a stop string could straddle) is searched, so a token costs the same at the 500th as at
the 5th.
"""

from __future__ import annotations

import bisect
import codecs
from collections.abc import Callable, Iterable, Sequence


class StopStrings:
    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]

    def __bool__(self) -> bool:
        return bool(self.stops)

    def cut(self, text: str, start: int = 0) -> int | None:
        """The index of the first stop string in `text` from `start` on, or None when it holds none there."""
        found = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
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


class StopScan:
    """One stream's generated text and where a stop string ends it, fed token by token.

    `piece(id) -> bytes` gives a token's bytes (through an incremental UTF-8 decoder: a character split
    across tokens appears once whole). `end` is None until a stop string is reached, then the index in
    `text` where the text ends; `kept` is how many of the fed tokens lie wholly before it (all of them
    while none is reached). `after_bos`: the stream follows BOS alone (an empty prompt), so its first token's
    leading space, the dummy prefix, is dropped, as Tokenizer.decode drops it after BOS: the text starts "Once", not
    " Once"."""

    def __init__(self, stops: StopStrings, piece: Callable[[int], bytes], after_bos: bool = False):
        self.stops = stops
        self.piece = piece
        self._after_bos = after_bos
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._straddle = max((len(s) for s in stops.stops), default=1) - 1  # characters before new text to search
        self.text = ""
        self.end: int | None = None
        self._ends: list[int] = []  # the text's length after each token

    @property
    def stopped(self) -> bool:
        return self.end is not None

    @property
    def kept(self) -> int:
        return len(self._ends) if self.end is None else bisect.bisect_right(self._ends, self.end)

    def feed(self, tokens: Iterable[int]) -> None:
        """Add tokens to the text; nothing more is added once a stop string is reached."""
        for t in tokens:
            if self.stopped:
                return
            piece = self.piece(t)
            if self._after_bos:
                piece, self._after_bos = piece.removeprefix(b" "), False
            self._add(self._utf8.decode(piece))
            self._ends.append(len(self.text))

    def finish(self) -> None:
        """The stream ended: flush a character left incomplete by the last token."""
        if not self.stopped:
            self._add(self._utf8.decode(b"", final=True))

    def _add(self, new: str) -> None:
        if not new:
            return
        start = max(0, len(self.text) - self._straddle)  # no stop string lies wholly before the new text
        self.text += new
        if self.stops:
            self.end = self.stops.cut(self.text, start)

    def showable(self) -> int:
        """How far the text may be shown now: up to the stop string once reached, else all but an ending
        that may begin one."""
        return self.end if self.end is not None else self.stops.showable(self.text)

    def final(self) -> str:
        """The stream's text: everything fed, ending before the first stop string."""
        return self.text[:self.end]
