"""The drafter's sliding window: a drafter whose context is full is re-primed on the stream's last tokens.

A drafter's output is only a proposal: the verifier judges every draft, so the text is lossless whatever
the drafter sees. When a round wants more drafts than the drafter's context has room for, the decode loop
(host/decode/orchestrator.py) re-primes it: BEGIN again (a board's existing request, which prefills its
prompt; a host drafter's `begin`) with the stream's last `keep` tokens as its prompt. The drafter then holds
the stream from `base` on, at its own positions 0.., and its drafts are moved back to stream positions.

`keep` is a quarter of the drafter's context by default (KEEP_SHARE): a re-prime prefills `keep` - 1
positions (one pass each on a drafter board, whose engine takes one position per pass) and buys
max_seq - keep - 1 positions of drafting, so a smaller window re-primes less per token; a quarter of the
classic ESP32 drafter's 256 positions (64 tokens) still holds several sentences of a story (at gamma 4 on the
default prompt's 500 greedy tokens, a half, a quarter and an eighth all gave 3.42 tokens per verification), and
its BEGIN line (201 bytes) fits the 259 bytes a classic ESP32's UART console ring holds (host/boardclasses.py
CONSOLE_RING), so a copy of it resent while the board prefills is not lost; a half's (372 bytes) would not.

Sampling: a drafter draws each draft with purpose DRAFT at its own position, so a window that began at
`base` would repeat the draws of positions it already drew at. Each window therefore drafts under a seed
of its own, `window_seed(seed, base)` (the stream's seed for the first window, base 0): no (seed, position)
of a DRAFT draw repeats within a stream, so a draft stays a fresh sample of the q-hat table it sends, which
the acceptance rule's losslessness needs; every back-end derives the same, so boards and host engines
draft the same text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from specmesh.host.backends import Draft, SessionParams

KEEP_SHARE = 4  # a re-primed drafter keeps its context's 1 / KEEP_SHARE: the stream's last tokens
_SPREAD = 0x9E3779B9  # odd (2^32 / golden ratio): base -> seed is one-to-one modulo 2^32


def window_seed(seed: int, base: int) -> int:
    """The seed a drafter window beginning at stream position `base` drafts under (`seed` itself at 0)."""
    return (seed + base * _SPREAD) & 0xFFFFFFFF


class Window:
    """Where the drafter's view of the stream begins (`base`), and when it moves."""

    def __init__(self, max_seq: int, keep: int | None = None):
        self.max_seq = max_seq
        self.keep = max(1, keep if keep is not None else max_seq // KEEP_SHARE)
        self.base = 0
        self.moves = 0  # re-primes so far

    def start(self, prompt: Sequence[int]) -> list[int]:
        """The drafter's prompt for a stream: all of it when it fits, else its last `keep` tokens."""
        self.base = len(prompt) - self.keep if len(prompt) >= self.max_seq else 0
        return list(prompt[self.base:])

    def view(self, committed: Sequence[int]) -> list[int]:
        """The stream as the drafter holds it."""
        return list(committed[self.base:])

    def room(self, length: int) -> int:
        """The most drafts the drafter's context has room for after a stream of `length` tokens."""
        return self.max_seq - (length - self.base) - 1

    def full(self, length: int, gamma: int) -> bool:
        """Whether gamma drafts after a stream of `length` tokens need a re-prime: they do not fit, and moving
        the window makes more room."""
        return gamma > self.room(length) and length - self.base > self.keep

    def move(self, committed: Sequence[int]) -> list[int]:
        """Re-prime: the window now begins `keep` tokens before the stream's end; returns the drafter's prompt."""
        self.base = max(0, len(committed) - self.keep)
        self.moves += 1
        return list(committed[self.base:])

    def params(self, params: SessionParams) -> SessionParams:
        """The session the drafter begins for this window: the stream's, under the window's seed."""
        return dataclasses.replace(params, seed=window_seed(params.seed, self.base)) if self.base else params

    def draft(self, draft: Draft) -> Draft:
        """A draft made at the drafter's positions, at the stream's."""
        return Draft(draft.pos0 + self.base, draft.tokens, draft.q)
