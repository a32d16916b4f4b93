"""The board's own engine on the host: firmware/engine.py with its C kernels, in a `micropython` process.

`PipeEngine(path)` has the numpy `Engine`'s interface (host/backends/engine.py: `header`, `forward(tokens,
start_pos)` -> int64 Q16 logits `[k, vocab]`, `rollback`, `reset`, `length`) and its integers bit for bit
(docs/CONTRACTS.md section 4), at the speed of the machine code a board runs: a position of drafter.spm takes
about 0.05 ms in the x64 module, where numpy's hundred small array operations a layer take 1.1 ms
(drafter-host.spm: 0.08 and 2.5 ms). It is the `cpu` drafter's engine (`--drafter cpu`, host/cli/registry.py)
where the `micropython` binary (`make setup`) runs the native kernels (an x64 host: firmware/native/x64.mpy);
elsewhere `PipeEngine.start` gives None and the numpy engine drafts. The process is
host/backends/mpy/engine_pipe.py (its docstring: the pipe's format), run in that script's folder (the kernel
picker writes its crash mark into the working directory's native/, which that folder lacks) and in a process
group of its own, out of the terminal's Ctrl-C, which the host handles; it ends when its stdin closes.
"""

from __future__ import annotations

import os
import subprocess
import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from specmesh.host.layout import ROOT, micropython_binary
from specmesh.shared.modelfile import HEADER_SIZE, parse_header

SCRIPT = Path(__file__).with_name("mpy") / "engine_pipe.py"
KMAX = 8  # positions per pass in the process (its buffers); a longer forward is fed in passes


class EngineGone(RuntimeError):
    """The engine's process ended (killed, or out of memory; or ended here, its exchange interrupted): its cache is
    lost."""


class PipeEngine:
    """One model's engine in a `micropython` process; one sequence."""

    def __init__(self, path: str | os.PathLike, proc: subprocess.Popen):
        # the process ends with this object if not closed before: dropped unclosed (a Ctrl-C between its start and its
        # owner keeping it), its Popen, which subprocess keeps to reap it, would hold its stdin open, and the process
        # alive, as long as the host runs
        self._end = weakref.finalize(self, _stop, proc)
        self._proc = proc
        with open(path, "rb") as f:
            self.header = parse_header(f.read(HEADER_SIZE))
        self.vocab = self.header.vocab
        self.length = 0
        self.interrupted = False  # a forward was broken into (Ctrl-C): its process was ended, nothing wrong with it

    @classmethod
    def start(cls, path: str | os.PathLike) -> PipeEngine | None:
        """The engine of model file `path` in a new process, or None where it would not run native kernels (no
        micropython binary, no native module for this machine, a module that fails its self-test) or the file
        does not load: the caller's numpy engine then says why, if anything is wrong with the file."""
        exe = micropython_binary()
        if exe is None:
            return None
        try:
            proc = subprocess.Popen([exe, SCRIPT.name, str(ROOT), str(Path(path).resolve()), str(KMAX)],
                                    cwd=SCRIPT.parent, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.DEVNULL, process_group=0)  # not the terminal's Ctrl-C
        except OSError:
            return None
        assert proc.stdout is not None
        try:
            ready = proc.stdout.readline() == b"native\n"  # the kernels it runs (nothing: the file did not load)
        except BaseException:  # Ctrl-C while it loads
            _stop(proc, wait_s=0)
            raise
        if not ready:
            _stop(proc)
            return None
        return cls(path, proc)

    def forward(self, tokens: Sequence[int], start_pos: int | None = None) -> np.ndarray:
        """Logits [k, vocab] for tokens at positions start_pos.., after which the cache holds start_pos + k.

        `start_pos` defaults to the cached length; a smaller one rolls back first; a larger one is an error.
        """
        p0 = self.length if start_pos is None else start_pos
        if p0 < 0 or p0 > self.length:
            raise ValueError("start position %d is beyond the %d cached positions" % (p0, self.length))
        ids = [int(t) for t in tokens]
        if not ids:
            raise ValueError("forward needs at least one token")
        if not all(0 <= t < self.vocab for t in ids):
            raise ValueError("token id out of range [0, %d)" % self.vocab)
        if p0 + len(ids) > self.header.max_seq:
            raise ValueError("positions %d.. run past the context of %d" % (p0, self.header.max_seq))
        assert self._proc.stdin is not None and self._proc.stdout is not None
        want = 4 * len(ids) * self.vocab
        try:
            self._proc.stdin.write(np.array([p0, len(ids), *ids], "<u2").tobytes())
            self._proc.stdin.flush()
            data = self._proc.stdout.read(want)
        except (BrokenPipeError, ValueError):
            data = b""
        except BaseException:
            # Ctrl-C (a KeyboardInterrupt in the Python API's caller) mid-exchange: the request may be half sent, its
            # reply unread or half read, and the next forward would read this one's rows as its own, wrong text
            # without a word. The process ends here, so that the next forward is EngineGone.
            self.interrupted = True
            _stop(self._proc, wait_s=0)
            raise
        if len(data) != want:
            raise EngineGone("the engine process ended (status %s)" % self._proc.poll())
        self.length = p0 + len(ids)
        return np.frombuffer(data, "<i4").reshape(len(ids), self.vocab).astype(np.int64)

    def rollback(self, length: int) -> None:
        """Forget every position at or beyond `length` (the next forward tells the process)."""
        self.length = min(self.length, max(0, length))

    def reset(self) -> None:
        self.length = 0

    def close(self) -> None:
        self._end()


def _stop(proc: subprocess.Popen, wait_s: float = 2) -> None:
    """End the process: its stdin closed, it returns (killed if it has not within `wait_s` seconds)."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=wait_s)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
