"""The numpy engine: one stream of host/backends/arraymath.py's `IntModel`, the host CPU back-end and the oracle.

`Engine(path)` loads a model file; `forward(tokens, start_pos)` runs one batched pass over k new
positions and returns the int64 Q16 logits `[k, vocab]`, bit-identical to the firmware engine's
(docs/CONTRACTS.md section 4); `rollback(length)` and `reset()` cut its KV cache.
`to_float` gives the logits' real values; `argmax`, `target_table` and `draft_table` turn a logits row into what
the acceptance rule consumes (shared/sampling.py, integers only); `unsure` says whether a row's top logit barely
leads (LocalDrafter's block stop).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from specmesh.host.backends.arraymath import EXP_TABLE, IntModel
from specmesh.shared import sampling


class Engine:
    """A model file's integer transformer with an int8 KV cache; one sequence."""

    def __init__(self, model: str | os.PathLike):
        self.model = IntModel(model)
        self.header = self.model.header
        self.model.open_stream()  # slot 0

    @property
    def vocab(self) -> int:
        return self.header.vocab

    @property
    def n_ctx(self) -> int:
        return self.header.max_seq

    @property
    def length(self) -> int:
        return self.model.length(0)

    def reset(self) -> None:
        self.model.rollback(0, 0)

    def rollback(self, length: int) -> None:
        """Forget every position at or beyond `length` (a no-op if the cache is already shorter)."""
        self.model.rollback(0, length)

    def forward(self, tokens: Sequence[int], start_pos: int | None = None) -> np.ndarray:
        """Logits [k, vocab] for tokens at positions start_pos.., after which the cache holds start_pos + k.

        `start_pos` defaults to the cached length; a smaller one rolls back first; a larger one is an error.
        """
        p0 = self.length if start_pos is None else start_pos
        if p0 < 0 or p0 > self.length:
            raise ValueError("start position %d is beyond the %d cached positions" % (p0, self.length))
        self.rollback(p0)
        return self.model.forward([(0, [int(t) for t in tokens])])[0]


def to_float(logits: np.ndarray) -> np.ndarray:
    """Q16 logits as the real numbers they stand for (for losses and comparisons with float models)."""
    return np.asarray(logits, np.float64) / (1 << 16)


def argmax(logits: np.ndarray) -> int:
    """Index of the largest logit; ties go to the lowest id; ValueError on a NaN logit (CONTRACTS 1)."""
    i = int(np.argmax(logits))  # numpy returns the first NaN if there is one
    if np.isnan(logits[i]):
        raise ValueError("NaN logit at index %d" % i)
    return i


def unsure(logits: np.ndarray, margin: int) -> bool:
    """Whether a logits row's largest value leads the next largest by less than `margin` (ties: unsure)."""
    top = np.partition(logits, len(logits) - 2)[-2:]
    return int(top[1]) - int(top[0]) < margin


def target_table(logits: np.ndarray, temp_milli: int, top_k: int = 0, top_p_q16: int = 0) -> list[int]:
    """The target's table (ints summing to ONE) of one logits row (shared/sampling.py)."""
    row = [int(v) for v in logits]
    return sampling.table(row, 0, len(row), temp_milli, top_k, top_p_q16, EXP_TABLE)


def draft_table(logits: np.ndarray, temp_milli: int, k: int) -> tuple[list[int], list[int]]:
    """The drafter's q-hat (ids, weights) of one logits row (shared/sampling.py)."""
    row = [int(v) for v in logits]
    return sampling.draft_table(row, 0, len(row), temp_milli, k, EXP_TABLE)
