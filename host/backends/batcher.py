"""Many streams, one forward: gathers the pending requests of concurrent streams into batched passes.

Each stream (one per drafter, run by its own thread or task) calls `Batcher.forward(slot, tokens)` and
blocks; a worker thread takes everything pending, runs it as one `IntModel.forward`
(host/backends/arraymath.py; ragged runs are packed, attention is masked per stream), and hands each
caller its own logits. The worker runs a batch as soon as every registered stream has a request
pending (nobody else can add one; a stream marked `idle` is not waited for), when `max_batch` requests wait, or `window_s` after the first
request arrived (a stream busy elsewhere, e.g. drafting, does not stall the others). So forward calls per token fall as the number of streams grows; `stats`
counts them (`python -m specmesh.tools.bench gpu`, e2e rows: 64 streams in Python threads took 2 passes per
round, 256 took 3, with the 2 ms default window). Streams never share state: each owns a cache slot,
and a slot may have one request pending. Stream bookkeeping (`open_stream`, `rollback`,
`close_stream`) is serialised with the passes. `StreamEngine` is one stream of a Batcher in the numpy
`Engine`'s shape, so host/backends' `EngineStream` (and so the local drafter and verifier, and the torch
verifier) runs on it unchanged.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from specmesh.host.backends.arraymath import IntModel


class Batcher:
    """Serves `forward` requests of many streams on one `IntModel`, in batches."""

    def __init__(self, model: IntModel, max_batch: int = 256, window_s: float = 0.002):
        self.model = model
        self.max_batch = max_batch
        self.window_s = window_s
        self.batches = 0  # forward passes run
        self.requests = 0  # stream requests served
        self._cond = threading.Condition()
        self._model_lock = threading.Lock()
        self._pending: dict[int, tuple[list[int], Future]] = {}
        self._streams = 0
        self._idle: set[int] = set()  # open streams that send nothing for now (a server's free lanes)
        self._closed = False
        self._worker = threading.Thread(target=self._loop, name="specmesh-batcher", daemon=True)
        self._worker.start()

    # -- streams (called from the streams' threads) ------------------------------------------------

    def open_stream(self) -> int:
        with self._model_lock:
            slot = self.model.open_stream()
        with self._cond:
            self._streams += 1
        return slot

    def close_stream(self, slot: int) -> None:
        with self._model_lock:
            self.model.close_stream(slot)
        with self._cond:
            self._streams -= 1
            self._idle.discard(slot)
            self._cond.notify()  # the remaining streams may now all be pending

    def idle(self, slot: int, idle: bool = True) -> None:
        """Stream `slot` sends nothing until `idle(slot, False)`: the others' batches do not wait for it."""
        with self._cond:
            (self._idle.add if idle else self._idle.discard)(slot)
            self._cond.notify()

    def rollback(self, slot: int, length: int) -> None:
        with self._model_lock:
            self.model.rollback(slot, length)

    def length(self, slot: int) -> int:
        with self._model_lock:
            return self.model.length(slot)

    def submit(self, slot: int, tokens: Sequence[int]) -> Future:
        """Queue a run of tokens for stream `slot`; the future gives its logits [len(tokens), vocab]."""
        fut: Future = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            if slot in self._pending:
                raise ValueError("stream %d already has a request pending" % slot)
            self._pending[slot] = (list(tokens), fut)
            self._cond.notify()
        return fut

    def forward(self, slot: int, tokens: Sequence[int]) -> np.ndarray:
        """`submit` and wait: the logits of this stream's run, computed in a batch with the others."""
        return self.submit(slot, tokens).result()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._worker.join()

    @property
    def stats(self) -> dict:
        return {"batches": self.batches, "requests": self.requests,
                "requests_per_batch": self.requests / self.batches if self.batches else 0.0}

    # -- worker ----------------------------------------------------------------------------------

    def _ready(self, deadline: float | None) -> bool:
        n = len(self._pending)
        return (n >= self.max_batch or n >= self._streams - len(self._idle)
                or (deadline is not None and time.monotonic() >= deadline))

    def _take(self) -> list[tuple[int, list[int], Future]] | None:
        with self._cond:
            deadline = None
            while not self._closed:
                if self._pending and deadline is None:
                    deadline = time.monotonic() + self.window_s
                if self._pending and self._ready(deadline):
                    break
                self._cond.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if self._closed and not self._pending:
                return None
            slots = list(self._pending)[:self.max_batch]
            return [(s, *self._pending.pop(s)) for s in slots]

    def _loop(self) -> None:
        while (batch := self._take()) is not None:
            self._run(batch)

    def _run(self, batch: list[tuple[int, list[int], Future]]) -> None:
        try:
            with self._model_lock:
                out = self.model.forward([(s, toks) for s, toks, _ in batch])
        except Exception as exc:  # noqa: BLE001 - forward checks every run before touching a cache
            if len(batch) == 1:
                batch[0][2].set_exception(exc)
            else:  # only the bad request fails: the others run alone
                for one in batch:
                    self._run([one])
            return
        self.batches += 1
        self.requests += len(batch)
        for (_, _, fut), logits in zip(batch, out):
            fut.set_result(logits)


class StreamEngine:
    """One stream of a shared model, with the numpy `Engine`'s header/forward/rollback for EngineStream."""

    def __init__(self, batcher: Batcher):
        self.batcher = batcher
        self.header = batcher.model.header
        self.slot = batcher.open_stream()

    def forward(self, tokens: Sequence[int], start_pos: int) -> np.ndarray:
        self.batcher.rollback(self.slot, start_pos)
        if self.batcher.length(self.slot) != start_pos:
            raise ValueError("start position %d is beyond the cached positions" % start_pos)
        return self.batcher.forward(self.slot, tokens)

    def rollback(self, length: int) -> None:
        self.batcher.rollback(self.slot, length)

    def idle(self, idle: bool = True) -> None:
        self.batcher.idle(self.slot, idle)

    def close(self) -> None:
        self.batcher.close_stream(self.slot)
