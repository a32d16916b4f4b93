"""The torch verifier back-end: a specmesh model file run by PyTorch on CUDA or the CPU, many streams.

`TorchXp` is host/backends/arraymath.py's array namespace on a torch device, so the model (`TorchModel`) is
the same `IntModel` as the numpy engine's, computing the same integers (docs/CONTRACTS.md section 4)
bit for bit: int64 arithmetic, and integer dot products as float64 matmuls, exact in any summation
order, CUDA's included. One `IntModel` keeps one KV cache slot per stream; `forward` runs one batched
pass over any number of streams, each appending its own ragged run of tokens (a verify round: the last
committed token and the gamma drafts).

`TorchVerifier` is the orchestrator's `Verifier` (host/backends/__init__.py) for one stream; the streams of one
model and device share a `Batcher` (host/backends/batcher.py), which runs their pending requests as one pass.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np

try:
    import torch
except ImportError:  # torch is the optional `gpu` extra; the host works without it
    torch = None

from specmesh.host.backends import BackendError, EngineStream, LocalVerifier, SessionParams
from specmesh.host.backends.arraymath import IntModel, Xp
from specmesh.host.backends.batcher import Batcher, StreamEngine
from specmesh.shared.modelfile import ModelFileError

INSTALL_HINT = "PyTorch is not installed: `make setup-gpu` in a checkout, else pip install 'specmesh[gpu]'"


def pick_device(name: str) -> str:
    """Check that torch device `name` ("cuda", "cpu" or "auto") can run here; BackendError if not."""
    if torch is None:
        raise BackendError(INSTALL_HINT)
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        why = "no CUDA device is visible" if torch.version.cuda else "this torch is a CPU-only build"
        raise BackendError("the gpu verifier needs CUDA, but %s (torch %s): use --verifier torch-cpu"
                           % (why, torch.__version__))
    return name


class TorchXp(Xp):
    """host/backends/arraymath.py's array operations on a torch device (int64 tensors)."""

    def __init__(self, device: str):
        self.device = device
        self.name = "torch-" + device

    def asarray(self, a, dtype=np.int64):
        t = torch.as_tensor(np.asarray(a, dtype=dtype))
        return t.to(self.device)

    def zeros(self, shape, int8=False):
        return torch.zeros(shape, dtype=torch.int8 if int8 else torch.int64, device=self.device)

    def amax(self, a, axis=-1):
        return a.amax(dim=axis, keepdim=True)

    def sum(self, a, axis=-1):
        return a.sum(dim=axis, keepdim=True)

    def clip(self, a, lo, hi):
        return torch.clamp(a, lo, hi)

    def where(self, c, a, b):
        def t(v):
            return torch.as_tensor(v, device=self.device)

        return torch.where(t(c), t(a), t(b))

    def einsum(self, spec, a, b):
        return torch.einsum(spec, a.double(), b.double()).long()

    def bitlen(self, m):
        return torch.frexp(m.double())[1].long()

    def floor_sqrt(self, a):
        r = torch.floor(torch.sqrt(a.double())).long()
        r = r - (r * r > a).long()
        return r + ((r + 1) * (r + 1) <= a).long()

    def int64(self, a):
        return a.long()

    def int8(self, a):
        return a.to(torch.int8)

    def swap(self, a, i: int, j: int):
        return a.transpose(i, j)

    def numpy(self, a) -> np.ndarray:
        return a.cpu().numpy()


class TorchModel(IntModel):
    """The model on a torch device (`pick_device` names it): host/backends/arraymath.py's `IntModel` on `TorchXp`."""

    def __init__(self, path, device: str = "auto", streams: int = 1):
        xp = TorchXp(pick_device(device))
        super().__init__(path, xp, streams)
        self.device = xp.device


class TorchVerifier(LocalVerifier):
    """The target on torch for one stream: the numpy verifier's protocol and rule, batched logits."""

    def __init__(self, batcher: Batcher, name: str):
        self.stream = EngineStream(None, engine=StreamEngine(batcher))
        self.batcher = batcher
        self.name = name
        self.max_seq = self.stream.max_seq
        self.bus_bytes = 0
        self.params = SessionParams()

    def stats(self) -> dict:
        return {**super().stats(), **self.batcher.stats}

    def close(self) -> None:
        self.stream.engine.close()


_shared: dict[tuple[str, str], Batcher] = {}
_shared_lock = threading.Lock()


def shared_batcher(model_path, device: str) -> Batcher:
    """The one Batcher serving every stream of this model file on this device in this process."""
    dev = pick_device(device)
    key = (str(Path(model_path).resolve()), dev)
    with _shared_lock:
        if key not in _shared:
            try:
                _shared[key] = Batcher(TorchModel(model_path, dev))
            except (OSError, ModelFileError) as e:
                raise BackendError("cannot load model %s: %s" % (model_path, e)) from None
        return _shared[key]


def make_verifier(model_path, device: str = "cpu", **_options) -> TorchVerifier:
    """A torch verifier for one new stream (`--verifier torch-cpu` / `gpu`)."""
    return TorchVerifier(shared_batcher(model_path, device), "gpu" if device.startswith("cuda") else "torch-cpu")

