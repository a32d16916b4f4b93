"""The torch verifier back-end: a specmesh model file run by PyTorch on CUDA or the CPU, many streams.

`TorchModel` loads a model file (host/modelio.py) onto a device and keeps one KV cache per stream in a
pooled tensor (one slot per stream). `forward` runs one batched pass over any number of streams, each
appending its own ragged run of tokens (a verify round: the last committed token and the gamma drafts).
Positions are packed for every per-position step (matvecs, norms, RoPE, MLP); only attention pads them,
to [streams, longest run], with a causal mask over each stream's own cache slot, so streams never see
each other's tokens. `rollback` cuts a stream back to its committed length.

The arithmetic is the numpy reference's (host/engine.py, docs/CONTRACTS.md section 4: the firmware's),
operation for operation, so that the logits are the same bits (asserted on the CPU; on CUDA within the
tolerance its tests state). A float32 difference of one ulp is not harmless here: it can flip an
activation's int8 rounding, which moves logits by ~1% from then on (a KV cache entry keeps it). Hence:
- integer dot products are exact: int8 values held as float32, and a float32 matmul of such integers
  is exact while every partial sum stays below 2^24, so columns are cut into chunks of at most
  `EXACT_COLS` (127 * 127 * 1040 < 2^24) whose sums are added in float64. On CUDA that needs IEEE
  float32 matmuls, not TF32: `TorchModel` sets the float32 matmul precision to "highest" (the default);
  attention's integer products (30-bit queries, 2^23-sum weights) run in float64, exact below 2^53;
- the float64 steps (RMSNorm, RoPE, SwiGLU, attention's softmax) run in float64 and are rounded to
  float32 where the engine rounds; sums the firmware runs in order are cumulative sums (sequential on
  the CPU; CUDA scans in its own order, one source of its tolerance, its exp the other);
- the KV cache holds the int8 values and their float32 scales, one slot per stream.

`TorchVerifier` is the orchestrator's `Verifier` (host/backends.py) for one stream; the streams of one
model and device share a `Batcher` (host/batcher.py), which runs their pending requests as one pass.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

try:
    import torch
except ImportError:  # torch is the optional `gpu` extra; the host works without it
    torch = None

from host.backends import BackendError, EngineStream, LocalVerifier, SessionParams, register_verifier
from host.batcher import Batcher
from host.engine import QMAX, WSUM, rope_tables
from host.modelio import QTensor, read_model
from shared.modelfile import FLAG_SHARED_CLS, ModelFileError

INSTALL_HINT = "PyTorch is not installed: `make setup-gpu` in a checkout, else pip install 'specmesh[gpu]'"
EXACT_COLS = 1040  # 127 * 127 * 1040 = 16_774_160 < 2^24


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


def quantize_act(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row int8 (engine.quantize_act): (values held as float32, scale [n, 1]); a zero row gives 0s."""
    xs = x.abs().amax(dim=-1, keepdim=True) / 127.0
    safe = torch.where(xs > 0, xs, torch.ones_like(xs))
    return torch.clamp(torch.floor(x / safe + 0.5), -127.0, 127.0), xs


class _Mat:
    """A per-row int8 matrix on the device: `q` int8 [rows, cols], exact float32 column chunks, scales."""

    def __init__(self, qt: QTensor, device: str):
        self.q = torch.from_numpy(np.ascontiguousarray(qt.q)).to(device)
        self.s = torch.from_numpy(np.asarray(qt.s, dtype=np.float32)).to(device)
        self.chunks = [c.float().T.contiguous() for c in torch.split(self.q, EXACT_COLS, dim=1)]  # [cols, rows]

    def matvec(self, x: torch.Tensor) -> torch.Tensor:
        """(Wq @ quant(x[j])) * ws * xs[j] for every row j of x [n, cols] -> [n, rows] (engine.Mat.matvec)."""
        xq, xs = quantize_act(x)
        if len(self.chunks) == 1:
            acc = xq @ self.chunks[0]
        else:
            parts = torch.split(xq, EXACT_COLS, dim=1)
            acc = sum((p @ w).double() for p, w in zip(parts, self.chunks)).float()
        return acc * self.s * xs


def _seqsum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim from left to right (engine.seqsum; a parallel scan on CUDA)."""
    return torch.cumsum(x, dim=-1)[..., -1:]


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """engine.rmsnorm: f32(x * w / sqrt(ss / dim + eps)) in float64."""
    x = x.double()
    return (x * w.double() / torch.sqrt(_seqsum(x * x) / x.shape[-1] + eps)).float()


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """engine.rope on rows x [n, heads * hd], cos/sin [n, hd / 2] at each row's position."""
    n = x.shape[0]
    pairs = x.double().view(n, -1, cos.shape[1], 2)
    a, b = pairs[..., 0], pairs[..., 1]
    c, s = cos.double()[:, None, :], sin.double()[:, None, :]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).view(n, -1).float()


def swiglu(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """engine.swiglu: f32(a / (1 + exp(-a)) * b) in float64, 0 where a < -80."""
    a = a.double()
    return torch.where(a < -80.0, 0.0, a / (1.0 + torch.exp(-a)) * b.double()).float()


def attention(q, kq, ks, vq, vs, visible) -> torch.Tensor:
    """engine.attention (the firmware's integer attention) on torch tensors, the same shapes."""
    hd = q.shape[-1]
    q = q.double()
    s = q.abs().amax(dim=-1, keepdim=True) / QMAX
    v = torch.floor(q / torch.where(s > 0, s, 1.0) + 0.5)
    dot = torch.einsum("...jgd,...td->...jgt", v, kq.double())
    score = dot * ks.double()[..., None, None, :] * (s * (1.0 / math.sqrt(hd)))
    hidden = ~visible[..., :, None, :]
    mx = score.masked_fill(hidden, float("-inf")).amax(dim=-1, keepdim=True)
    e = torch.exp((score.float().double() - mx).masked_fill(hidden, float("-inf")))
    w = e * vs.double()[..., None, None, :]
    ws = _seqsum(w)
    wi = torch.floor(w.float().double() * (WSUM / torch.where(ws > 0, ws, 1.0)) + 0.5)
    out = torch.einsum("...jgt,...td->...jgd", wi, vq.double())
    return torch.where(ws > 0, out * (ws / (WSUM * _seqsum(e))), 0.0).float()


class TorchModel:
    """A specmesh model file on a torch device, with one KV cache slot per open stream."""

    def __init__(self, path, device: str = "auto", streams: int = 1):
        self.device = dev = pick_device(device)
        torch.set_float32_matmul_precision("highest")  # IEEE float32: the integer matmuls stay exact
        h, t = read_model(path)
        self.header = h
        self.tok_emb = _Mat(t["tok_emb"], dev)
        self.layers = [{name.split(".", 2)[2]: (_Mat(v, dev) if isinstance(v, QTensor)
                                                else torch.from_numpy(v).to(dev))
                        for name, v in t.items() if name.startswith("layers.%d." % i)}
                       for i in range(h.n_layers)]
        self.final_norm = torch.from_numpy(t["final_norm"]).to(dev)
        self.cls = self.tok_emb if h.flags & FLAG_SHARED_CLS else _Mat(t["cls"], dev)
        self.cos, self.sin = (torch.from_numpy(t).to(dev) for t in rope_tables(h))
        self._lengths: list[int | None] = []  # per slot: cached positions, None when free
        self._cache: tuple | None = None  # int8 keys, key scales, int8 values, value scales
        self._grow(max(1, streams))

    # -- streams ---------------------------------------------------------------------------------

    def _grow(self, cap: int) -> None:
        h = self.header
        shape = (h.n_layers, cap, h.max_seq)
        new = tuple(torch.zeros(shape + ((h.kv_dim,) if i % 2 == 0 else ()),
                                dtype=torch.int8 if i % 2 == 0 else torch.float32, device=self.device)
                    for i in range(4))
        if self._cache is not None:
            for old, t in zip(self._cache, new):
                t[:, :old.shape[1]] = old
        self._cache = new
        self._lengths += [None] * (cap - len(self._lengths))

    def open_stream(self) -> int:
        """A new stream with an empty cache; returns its slot."""
        if None not in self._lengths:
            self._grow(2 * len(self._lengths))
        slot = self._lengths.index(None)
        self._lengths[slot] = 0
        return slot

    def close_stream(self, slot: int) -> None:
        self.length(slot)
        self._lengths[slot] = None

    def length(self, slot: int) -> int:
        """Positions held in the stream's cache."""
        if not (0 <= slot < len(self._lengths)) or self._lengths[slot] is None:
            raise ValueError("stream %d is not open" % slot)
        return self._lengths[slot]

    def rollback(self, slot: int, length: int) -> None:
        """Forget every position at or beyond `length` (a no-op if the cache is already shorter)."""
        if length < 0:
            raise ValueError("rollback length must be >= 0, got %d" % length)
        self._lengths[slot] = min(self.length(slot), length)

    # -- forward ---------------------------------------------------------------------------------

    def forward(self, runs: Sequence[tuple[int, Sequence[int]]]) -> list[np.ndarray]:
        """One batched pass: for each (slot, tokens), append the tokens to that stream's cache.

        Returns per run the float32 logits [len(tokens), vocab]; row i predicts the token after
        tokens[i]. Every run is checked before any cache changes; a slot may appear once per call.
        """
        h = self.header
        slots = [s for s, _ in runs]
        if not runs or len(set(slots)) != len(slots):
            raise ValueError("a forward batch needs one run per stream, at least one")
        starts = [self.length(s) for s in slots]
        counts = [len(toks) for _, toks in runs]
        for s, n0, n in zip(slots, starts, counts):
            if n < 1 or n0 + n > h.max_seq:
                raise ValueError("stream %d: %d positions after %d exceed the model's context of %d"
                                 % (s, n, n0, h.max_seq) if n else "forward needs at least one token")
        flat = [int(t) for _, toks in runs for t in toks]
        if min(flat) < 0 or max(flat) >= h.vocab:
            raise ValueError("token id out of range [0, %d)" % h.vocab)
        with torch.inference_mode():
            logits = self._forward(slots, starts, counts, flat).cpu().numpy()
        for s, n0, n in zip(slots, starts, counts):
            self._lengths[s] = n0 + n
        return np.split(logits, np.cumsum(counts)[:-1])

    def _forward(self, slots, starts, counts, flat) -> torch.Tensor:
        h, dev, hd = self.header, self.device, self.header.head_dim
        b, t_max, l_max = len(slots), max(counts), max(n0 + n for n0, n in zip(starts, counts))
        n_kv, group = h.n_kv_heads, h.n_heads // h.n_kv_heads
        # per packed row: token, stream, index in its run, position, cache slot (one host-to-device copy)
        row_b = np.repeat(np.arange(b), counts)
        row_t = np.arange(len(flat)) - (np.cumsum(counts) - counts)[row_b]
        pos = np.asarray(starts)[row_b] + row_t
        rows = torch.from_numpy(np.stack([flat, row_b, row_t, pos, np.asarray(slots)[row_b]])).to(dev)
        toks, row_b, row_t, pos, row_slot = rows
        starts_t, slots_t = torch.from_numpy(np.array([starts, slots])).to(dev)
        # key j is visible to query t of stream b iff j <= starts[b] + t: causal, in b's own slot only
        visible = (torch.arange(l_max, device=dev)[None, None, :]
                   <= (starts_t[:, None] + torch.arange(t_max, device=dev)[None, :])[:, :, None])
        cos, sin = self.cos[pos], self.sin[pos]
        x = self.tok_emb.q[toks].float() * self.tok_emb.s[toks][:, None]
        for i, w in enumerate(self.layers):
            xn = rmsnorm(x, w["attn_norm"], h.norm_eps)
            q = rope(w["wq"].matvec(xn), cos, sin)
            kq, ks = quantize_act(rope(w["wk"].matvec(xn), cos, sin))
            vq, vs = quantize_act(w["wv"].matvec(xn))
            kc, ksc, vc, vsc = self._cache
            kc[i, row_slot, pos], ksc[i, row_slot, pos] = kq.to(torch.int8), ks[:, 0]
            vc[i, row_slot, pos], vsc[i, row_slot, pos] = vq.to(torch.int8), vs[:, 0]
            keys = kc[i, slots_t, :l_max].view(b, l_max, n_kv, hd).transpose(1, 2)  # [b, kv head, j, hd]
            vals = vc[i, slots_t, :l_max].view(b, l_max, n_kv, hd).transpose(1, 2)
            qp = torch.zeros(b, t_max, h.n_heads * hd, device=dev)
            qp[row_b, row_t] = q
            o = attention(qp.view(b, t_max, n_kv, group, hd).transpose(1, 2), keys, ksc[i, slots_t, None, :l_max],
                          vals, vsc[i, slots_t, None, :l_max], visible[:, None])  # [b, kv head, t, g, hd]
            o = o.transpose(1, 2).reshape(b, t_max, h.n_heads * hd)[row_b, row_t]
            x = x + w["wo"].matvec(o)
            xn = rmsnorm(x, w["ffn_norm"], h.norm_eps)
            x = x + w["w2"].matvec(swiglu(w["w1"].matvec(xn), w["w3"].matvec(xn)))
        return self.cls.matvec(rmsnorm(x, self.final_norm, h.norm_eps))


class _StreamEngine:
    """One stream of a shared model, with the numpy `Engine`'s forward/rollback shape for EngineStream."""

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


class TorchVerifier(LocalVerifier):
    """The target on torch for one stream: the numpy verifier's protocol and rule, batched logits."""

    def __init__(self, batcher: Batcher, name: str):
        self.stream = EngineStream(None, engine=_StreamEngine(batcher))
        self.batcher = batcher
        self.name = name
        self.max_seq = self.stream.max_seq
        self.bus_bytes = 0
        self.params = SessionParams()

    def stats(self) -> dict:
        return {**super().stats(), **self.batcher.stats}

    def close(self) -> None:
        self.batcher.close_stream(self.stream.engine.slot)


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


def _factory(device: str):
    def make(model_path, **options):
        return make_verifier(model_path, device, **options)

    return make


register_verifier("torch-cpu", _factory("cpu"))  # works without torch too: it then says how to install it
register_verifier("gpu", _factory("cuda"))
