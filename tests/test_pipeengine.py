"""host/backends/pipeengine.py: the board's engine and C kernels in a `micropython` process, the host CPU back-ends'
engine. Its logits are the numpy engine's bit for bit through rollbacks and multi-pass forwards; where it cannot
run native kernels (no binary, no module for this machine) or its process dies mid-run, the numpy engine drafts
and verifies instead and the text does not change; its process is out of the terminal's Ctrl-C and ends on close."""

import os
import platform
import shutil
import signal

import numpy as np
import pytest

from specmesh import Mesh
from specmesh.host import backends
from specmesh.host.backends import pipeengine
from specmesh.host.backends.engine import Engine
from specmesh.host.backends.pipeengine import PipeEngine
from specmesh.host.layout import MODELS, ROOT, micropython_binary

pytestmark = pytest.mark.skipif(micropython_binary() is None or platform.machine() not in ("x86_64", "AMD64"),
                                reason="the engine process needs the micropython binary (make setup) and this "
                                       "machine's native module (firmware/native/x64.mpy: an x86-64 host)")


@pytest.mark.parametrize("model", ["drafter.spm", "drafter-esp32.spm", "drafter-host.spm", "target.spm"])
def test_its_logits_are_the_numpy_engine_s_through_rollbacks(model):
    mine, ref = PipeEngine.start(MODELS / model), Engine(MODELS / model)
    assert mine is not None  # native kernels: the machine code a board runs
    try:
        rng = np.random.default_rng(7)
        tokens = [int(t) for t in rng.integers(0, mine.vocab, 80)]
        assert (mine.forward(tokens[:37], 0) == ref.forward(tokens[:37], 0)).all()  # five passes of KMAX
        for step in range(30):
            p0 = int(rng.integers(max(0, ref.length - 6), ref.length + 1))  # a verify's rollback, or none
            run = tokens[step:step + int(rng.integers(1, 12))]
            got, want = mine.forward(run, p0), ref.forward(run, p0)
            assert got.dtype == want.dtype and got.shape == want.shape and (got == want).all(), step
        with pytest.raises(ValueError, match="beyond"):
            mine.forward([1], mine.length + 1)
    finally:
        mine.close()
    assert mine._proc.poll() is not None  # closed: its process ended


def test_without_native_kernels_or_the_binary_the_numpy_engine_runs(tmp_path, monkeypatch):
    for folder in ("firmware", "shared"):  # the sources without firmware/native/: the engine picks viper
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("native", "__pycache__"))
    monkeypatch.setattr(pipeengine, "ROOT", tmp_path)
    assert PipeEngine.start(MODELS / "drafter.spm") is None
    assert isinstance(backends.EngineStream(MODELS / "drafter.spm").engine, Engine)
    monkeypatch.setattr(pipeengine, "micropython_binary", lambda: None)
    assert PipeEngine.start(MODELS / "drafter.spm") is None
    bad = tmp_path / "bad.spm"
    bad.write_bytes((MODELS / "drafter.spm").read_bytes()[:-100])
    monkeypatch.undo()
    assert PipeEngine.start(bad) is None  # refused there too; the numpy engine says why
    with pytest.raises(backends.BackendError, match="truncated"):
        backends.EngineStream(bad)


def test_an_engine_process_that_dies_mid_run_leaves_the_numpy_engine_to_go_on():
    with Mesh(drafter="cpu", verifier="cpu") as mesh:
        lane = mesh._lanes[0]
        processes = [b.stream._own._proc for b in (lane.drafter, lane.verifier)]
        assert all(os.getpgid(p.pid) != os.getpgid(0) for p in processes)  # out of the terminal's Ctrl-C
        alone = mesh.generate("Once upon a time", max_tokens=40)
        for p in processes:
            os.kill(p.pid, signal.SIGKILL)
        again = mesh.generate("Once upon a time", max_tokens=40)
        assert again.token_ids == alone.token_ids and not again.stats["failovers"]
        assert all(isinstance(b.stream.engine, Engine) for b in (lane.drafter, lane.verifier))


class _Interrupted:
    """An engine process's stdout whose next read is broken into by Ctrl-C: the request was sent (or the process
    started), its reply (or its first line) not read."""

    def __init__(self, stdout):
        self.stdout, self.armed = stdout, True

    def _ctrl_c(self):
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt

    def read(self, n):
        self._ctrl_c()
        return self.stdout.read(n)

    def readline(self):
        self._ctrl_c()
        return self.stdout.readline()

    def close(self):
        self.stdout.close()


@pytest.mark.parametrize("role", ["drafter", "verifier"])
def test_a_generation_broken_into_by_ctrl_c_leaves_the_next_one_s_text_right(role):
    """Ctrl-C in a Python API caller while an engine process computed a reply (a KeyboardInterrupt out of generate)
    left that reply in the pipe: each later forward read the one before it's rows, and every later generation of the
    mesh gave wrong text without a word. The process is now ended there and started again at the next forward, fed
    the cached tokens: the next generation's text is the one it gives alone, on the board's engine still."""
    with Mesh(drafter="cpu", verifier="cpu") as mesh:
        alone = mesh.generate("Once upon a time", max_tokens=40)
        stream = getattr(mesh._lanes[0], role).stream
        proc = stream.engine._proc
        proc.stdout = _Interrupted(proc.stdout)
        with pytest.raises(KeyboardInterrupt):
            mesh.generate("Once upon a time", max_tokens=40)
        again = mesh.generate("Once upon a time", max_tokens=40)
        assert again.token_ids == alone.token_ids and not again.stats["failovers"]
        assert isinstance(stream.engine, PipeEngine) and stream.engine._proc is not proc


def test_an_engine_broken_into_as_it_starts_or_dropped_unclosed_ends_its_process(monkeypatch):
    """A Ctrl-C while an engine process loaded its model (a Python API caller's, in Mesh()), or between its start and
    its owner keeping it, left the process running as long as the host did: its Popen, which subprocess keeps to reap
    it, held its stdin open, so each such Ctrl-C in a notebook left a process of ~12 MB. It now ends in both cases."""
    import gc
    import subprocess

    started: list[subprocess.Popen] = []
    popen = subprocess.Popen

    def interrupted(*args, **kwargs):
        proc = popen(*args, **kwargs)
        proc.stdout = _Interrupted(proc.stdout)
        started.append(proc)
        return proc

    monkeypatch.setattr(pipeengine.subprocess, "Popen", interrupted)
    with pytest.raises(KeyboardInterrupt):
        PipeEngine.start(MODELS / "drafter.spm")
    monkeypatch.undo()
    assert started[0].wait(timeout=10) is not None
    engine = PipeEngine.start(MODELS / "drafter.spm")
    assert engine is not None
    proc = engine._proc
    del engine  # dropped, not closed
    gc.collect()
    assert proc.wait(timeout=10) is not None
