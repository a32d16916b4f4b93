"""The numpy reference engine: the firmware's int8 arithmetic (docs/CONTRACTS.md section 4), bit for bit.

It is the host CPU verifier back-end and the oracle the firmware and torch engines are checked against.
`Engine(path)` loads a model file; `forward(tokens, start_pos)` runs one batched pass over k new
positions (each weight matrix applied once to all k rows) and returns float32 logits `[k, vocab]`;
the KV cache holds int8 vectors with one float32 scale each; `rollback(length)` and `reset()` cut it.

Every step rounds where firmware/engine.py rounds (it computes in float64 on the unix port and stores
float32): matvecs, quantization and residual adds in float32; RMSNorm, RoPE, SwiGLU and attention in
float64, rounded to float32 once; attention in integers like the firmware's (30-bit query against the
int8 keys, weights quantized to sum to 2^23 against the int8 values). Integer dot products are exact
(float64 BLAS, every sum below 2^53), sums the firmware runs in order are cumulative sums, and the RoPE
tables come from libm through Python's math, as on the unix port. The torch back-end
(host/torch_backend.py) follows this module operation for operation.
`target_table` and `argmax` turn a logits row into what the acceptance rule consumes.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

from host.modelio import QTensor, read_model
from shared import sampling
from shared.modelfile import FLAG_SHARED_CLS, Header
from shared.rule import quantize

F32 = np.float32
F64 = np.float64
QMAX = (1 << 30) - 1  # attention: query heads become 30-bit ints
WSUM = float(1 << 23)  # attention: weights x value scales are quantized to sum to 2^23


class Mat:
    """A per-row int8 matrix ready for exact integer products: `wi` float64 ints, `s` float32 scales."""

    def __init__(self, qt: QTensor):
        self.q = qt.q
        self.wi = qt.q.astype(np.float64).T.copy()  # [cols, rows]: rows @ wi is the batched matvec
        self.s = qt.s.astype(F32)

    def matvec(self, x: np.ndarray) -> np.ndarray:
        """y[j] = (Wq @ quant(x[j])) * ws * xs[j] for every row j of x [k, cols] -> [k, rows]."""
        xq, xs = quantize_act(x)
        acc = (xq.astype(np.float64) @ self.wi).astype(F32)
        return acc * self.s[None, :] * xs[:, None]


def quantize_act(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row int8: xs = max|x| / 127, xq = clip(floor(x / xs + 0.5), -127, 127); an all-zero row gives 0s."""
    x = np.asarray(x, dtype=F32)
    xs = (np.abs(x).max(axis=-1) / F32(127.0)).astype(F32)
    safe = np.where(xs > 0, xs, F32(1.0))
    xq = np.clip(np.floor(x / safe[..., None] + F32(0.5)), -127, 127).astype(np.int8)
    return xq, xs


def seqsum(x: np.ndarray) -> np.ndarray:
    """Sum over the last axis from left to right, one float64 addition at a time (as the firmware sums)."""
    return np.cumsum(x, axis=-1)[..., -1:]


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """f32(x * w / sqrt(ss / dim + eps)) per row, ss the sum of squares: all in float64, rounded once."""
    x = x.astype(F64)
    d = np.sqrt(seqsum(np.square(x)) / x.shape[-1] + eps)
    return (x * w.astype(F64) / d).astype(F32)


def rope_freqs(h: Header) -> np.ndarray:
    """f32(theta^(-2i/hd)) for i < hd/2, by libm's pow as the firmware computes it."""
    hd = h.head_dim
    return np.array([math.pow(h.rope_theta, -2.0 * i / hd) for i in range(hd // 2)]).astype(F32)


def rope_tables(h: Header) -> tuple[np.ndarray, np.ndarray]:
    """f32(cos), f32(sin) of pos * freq for every position and pair [max_seq, hd/2], by libm as the firmware."""
    freqs = [float(f) for f in rope_freqs(h)]
    ang = [p * f for p in range(h.max_seq) for f in freqs]
    shape = (h.max_seq, len(freqs))
    return (np.array([math.cos(a) for a in ang]).astype(F32).reshape(shape),
            np.array([math.sin(a) for a in ang]).astype(F32).reshape(shape))


def rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """llama2.c RoPE on rows x [k, heads*hd] with cos/sin [k, hd/2]: each pair (a, b) of a head becomes
    f32(a*c - b*s), f32(a*s + b*c), computed in float64."""
    pairs = x.astype(F64).reshape(x.shape[0], -1, cos.shape[1], 2)
    a, b = pairs[..., 0], pairs[..., 1]
    c, s = cos.astype(F64)[:, None, :], sin.astype(F64)[:, None, :]
    return np.stack((a * c - b * s, a * s + b * c), axis=-1).reshape(x.shape).astype(F32)


def swiglu(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """f32(silu(a) * b) in float64, silu(a) = a / (1 + exp(-a)), and 0 where a < -80."""
    a = a.astype(F64)
    with np.errstate(over="ignore"):
        g = a / (1.0 + np.exp(-a)) * b.astype(F64)
    return np.where(a < -80.0, 0.0, g).astype(F32)


def attention(q: np.ndarray, kq: np.ndarray, ks: np.ndarray, vq: np.ndarray, vs: np.ndarray,
              visible: np.ndarray) -> np.ndarray:
    """The firmware's integer attention (docs/CONTRACTS.md section 4), vectorised.

    q [..., j, g, hd] float32 query heads (g heads share one kv head), kq/vq [..., t, hd] int8 keys and
    values with scales ks/vs [..., t] float32, visible [..., j, t] bool -> [..., j, g, hd] float32.
    """
    hd = q.shape[-1]
    q = q.astype(F64)
    s = np.abs(q).max(axis=-1, keepdims=True) / QMAX  # [.., j, g, 1]
    v = np.floor(q / np.where(s > 0, s, 1.0) + 0.5)  # 30-bit ints (all 0 for a zero head)
    dot = np.einsum("...jgd,...td->...jgt", v, kq.astype(F64))  # exact: |sum| < 2^53
    score = dot * ks.astype(F64)[..., None, None, :] * (s * (1.0 / math.sqrt(hd)))
    vis = visible[..., :, None, :]
    mx = np.where(vis, score, -np.inf).max(axis=-1, keepdims=True)
    e = np.exp(np.where(vis, score.astype(F32).astype(F64) - mx, -np.inf))
    w = e * vs.astype(F64)[..., None, None, :]
    ws = seqsum(w)
    wi = np.floor(w.astype(F32).astype(F64) * (WSUM / np.where(ws > 0, ws, 1.0)) + 0.5)
    out = np.einsum("...jgt,...td->...jgd", wi, vq.astype(F64))  # exact: |sum| < 2^31
    f = ws / (WSUM * seqsum(e))
    return np.where(ws > 0, out * f, 0.0).astype(F32)


class Engine:
    """A model file's int8 transformer with an int8 KV cache; one sequence."""

    def __init__(self, model: str | os.PathLike | tuple[Header, dict]):
        h, t = read_model(model) if isinstance(model, (str, os.PathLike)) else model
        self.header = h
        self.tok_emb = t["tok_emb"]
        self.layers = [{name.split(".", 2)[2]: (Mat(v) if isinstance(v, QTensor) else v.astype(F32))
                        for name, v in t.items() if name.startswith("layers.%d." % i)}
                       for i in range(h.n_layers)]
        self.final_norm = t["final_norm"].astype(F32)
        self.cls = Mat(self.tok_emb if h.flags & FLAG_SHARED_CLS else t["cls"])
        self.cos, self.sin = rope_tables(h)
        shape = (h.n_layers, h.max_seq)
        self.kq = np.zeros(shape + (h.kv_dim,), np.int8)
        self.ks = np.zeros(shape, F32)
        self.vq = np.zeros(shape + (h.kv_dim,), np.int8)
        self.vs = np.zeros(shape, F32)
        self.length = 0

    @property
    def vocab(self) -> int:
        return self.header.vocab

    @property
    def n_ctx(self) -> int:
        return self.header.max_seq

    def reset(self) -> None:
        self.length = 0

    def rollback(self, length: int) -> None:
        """Forget every position at or beyond `length` (a no-op if the cache is already shorter)."""
        if length < 0:
            raise ValueError("rollback length must be >= 0, got %d" % length)
        self.length = min(self.length, length)

    def forward(self, tokens: Sequence[int], start_pos: int | None = None) -> np.ndarray:
        """Logits [k, vocab] for tokens at positions start_pos.., after which the cache holds start_pos + k.

        `start_pos` defaults to the cached length; a smaller one rolls back first; a larger one is an error.
        """
        h = self.header
        toks = np.asarray(tokens, dtype=np.int64).reshape(-1)
        p0 = self.length if start_pos is None else start_pos
        k = toks.shape[0]
        if k == 0:
            raise ValueError("forward needs at least one token")
        if p0 < 0 or p0 > self.length:
            raise ValueError("start position %d is beyond the %d cached positions" % (p0, self.length))
        if p0 + k > h.max_seq:
            raise ValueError("%d positions exceed the model's context of %d" % (p0 + k, h.max_seq))
        if toks.min() < 0 or toks.max() >= h.vocab:
            raise ValueError("token id out of range [0, %d)" % h.vocab)
        end = p0 + k
        hd, n_kv, group = h.head_dim, h.n_kv_heads, h.n_heads // h.n_kv_heads
        cos, sin = self.cos[p0:end], self.sin[p0:end]
        # causal mask: query j (position p0 + j) sees keys 0..p0 + j
        visible = np.arange(end)[None, :] <= np.arange(p0, end)[:, None]
        x = (self.tok_emb.q[toks].astype(F32) * self.tok_emb.s[toks][:, None]).astype(F32)
        for i, w in enumerate(self.layers):
            xn = rmsnorm(x, w["attn_norm"], h.norm_eps)
            q = rope(w["wq"].matvec(xn), cos, sin)
            self.kq[i, p0:end], self.ks[i, p0:end] = quantize_act(rope(w["wk"].matvec(xn), cos, sin))
            self.vq[i, p0:end], self.vs[i, p0:end] = quantize_act(w["wv"].matvec(xn))
            kv = (self.kq[i, :end].reshape(end, n_kv, hd).transpose(1, 0, 2),
                  self.vq[i, :end].reshape(end, n_kv, hd).transpose(1, 0, 2))
            qh = q.reshape(k, n_kv, group, hd).transpose(1, 0, 2, 3)  # [kv head, j, g, hd]
            o = attention(qh, kv[0], self.ks[i, :end], kv[1], self.vs[i, :end], visible)
            x = x + w["wo"].matvec(o.transpose(1, 0, 2, 3).reshape(k, h.n_heads * hd))
            xn = rmsnorm(x, w["ffn_norm"], h.norm_eps)
            x = x + w["w2"].matvec(swiglu(w["w1"].matvec(xn), w["w3"].matvec(xn)))
        self.length = end
        return self.cls.matvec(rmsnorm(x, self.final_norm, h.norm_eps))


def argmax(logits: np.ndarray) -> int:
    """Index of the largest logit; ties go to the lowest id; ValueError on a NaN logit (CONTRACTS 1)."""
    i = int(np.argmax(logits))  # numpy returns the first NaN if there is one
    if np.isnan(logits[i]):
        raise ValueError("NaN logit at index %d" % i)
    return i


def target_probs(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> list[float]:
    """Float target distribution of one logits row: temperature, top-k, top-p (shared/sampling.py)."""
    return sampling.prepare([float(v) for v in logits], temperature, top_k, top_p)


def target_table(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> list[int]:
    """Quantized target distribution (ints summing to ONE) of one logits row, for the acceptance rule."""
    return quantize(target_probs(logits, temperature, top_k, top_p))
