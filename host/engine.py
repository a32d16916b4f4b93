"""The numpy reference engine: the int8 arithmetic of docs/CONTRACTS.md section 4, step for step.

It is the host CPU verifier back-end and the oracle the firmware and torch engines are checked against.
`Engine(path)` loads a model file; `forward(tokens, start_pos)` runs one batched pass over k new
positions (each weight matrix applied once to all k rows) and returns float32 logits `[k, vocab]`;
the KV cache holds int8 vectors with one float32 scale each; `rollback(length)` and `reset()` cut it.

Integer dot products are exact: int8 values are held as float64 and multiplied by BLAS, exact far
beyond any int32 sum a model can reach. Everything else is float32, in the contract's order, except
the float reductions (RMSNorm's mean of squares, attention dot products and weighted sums, softmax's
exp and sum) and SiLU's exp, computed in float64 and rounded to float32: those are where libraries
differ (summation order, exp implementations), and in float64 their differences vanish in the
rounding, so the torch back-end (host/torch_backend.py) reproduces this engine bit for bit.
`target_table` and `argmax` turn a logits row into what the acceptance rule consumes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from host.modelio import QTensor, read_model
from shared import sampling
from shared.modelfile import FLAG_SHARED_CLS, Header
from shared.rule import quantize

F32 = np.float32
F64 = np.float64


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


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    """x * w / sqrt(mean(x*x) + eps), per row; the mean of squares in float64, rounded to float32."""
    ms = np.mean(np.square(x.astype(F64)), axis=-1, keepdims=True).astype(F32)
    return (x * w / np.sqrt(ms + F32(eps))).astype(F32)


def rope_freqs(h: Header) -> np.ndarray:
    """theta^(-2i/hd) for i < hd/2, float32 (the firmware stores the same values)."""
    hd = h.head_dim
    return np.power(float(h.rope_theta), -np.arange(0, hd, 2, dtype=np.float64) / hd).astype(F32)


def rope(x: np.ndarray, pos: np.ndarray, freqs: np.ndarray) -> np.ndarray:
    """llama2.c RoPE on rows x [k, heads*hd] at positions pos [k]: rotate each pair (2i, 2i+1) of a head."""
    ang = pos.astype(np.float64)[:, None] * freqs.astype(np.float64)[None, :]
    c, s = np.cos(ang).astype(F32)[:, None, :], np.sin(ang).astype(F32)[:, None, :]
    pairs = x.reshape(x.shape[0], -1, freqs.shape[0], 2)
    a, b = pairs[..., 0], pairs[..., 1]
    return np.stack((a * c - b * s, a * s + b * c), axis=-1).reshape(x.shape).astype(F32)


def softmax(x: np.ndarray) -> np.ndarray:
    """Per row; exp and sum in float64, rounded to float32."""
    e = np.exp((x - x.max(axis=-1, keepdims=True)).astype(F64))
    return (e / e.sum(axis=-1, keepdims=True)).astype(F32)


def einsum64(spec: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A float32 contraction summed in float64 (float32 products are exact there), rounded to float32."""
    return np.einsum(spec, a.astype(F64), b.astype(F64)).astype(F32)


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
        self.freqs = rope_freqs(h)
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
        pos = np.arange(p0, p0 + k)
        end = p0 + k
        hd, n_kv, group = h.head_dim, h.n_kv_heads, h.n_heads // h.n_kv_heads
        # causal mask: query j (position p0 + j) sees keys 0..p0 + j
        visible = np.arange(end)[None, :] <= pos[:, None]
        x = (self.tok_emb.q[toks].astype(F32) * self.tok_emb.s[toks][:, None]).astype(F32)
        for i, w in enumerate(self.layers):
            xn = rmsnorm(x, w["attn_norm"], h.norm_eps)
            q = rope(w["wq"].matvec(xn), pos, self.freqs)
            kk = rope(w["wk"].matvec(xn), pos, self.freqs)
            self.kq[i, p0:end], self.ks[i, p0:end] = quantize_act(kk)
            self.vq[i, p0:end], self.vs[i, p0:end] = quantize_act(w["wv"].matvec(xn))
            keys = (self.kq[i, :end].astype(F32) * self.ks[i, :end, None]).reshape(end, n_kv, hd)
            vals = (self.vq[i, :end].astype(F32) * self.vs[i, :end, None]).reshape(end, n_kv, hd)
            qh = q.reshape(k, n_kv, group, hd)
            scores = einsum64("jkgd,tkd->kgjt", qh, keys) / F32(np.sqrt(hd))
            att = softmax(np.where(visible[None, None], scores, F32(-np.inf)))
            o = einsum64("kgjt,tkd->jkgd", att, vals).reshape(k, h.n_heads * hd)
            x = x + w["wo"].matvec(o)
            xn = rmsnorm(x, w["ffn_norm"], h.norm_eps)
            a = w["w1"].matvec(xn).astype(F64)
            with np.errstate(over="ignore"):
                g = (a / (1.0 + np.exp(-a))).astype(F32) * w["w3"].matvec(xn)
            x = x + w["w2"].matvec(g)
        self.length = end
        return self.cls.matvec(rmsnorm(x, self.final_norm, h.norm_eps))


def argmax(logits: np.ndarray) -> int:
    """Index of the largest logit; ties go to the lowest id."""
    return int(np.argmax(logits))


def target_probs(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> list[float]:
    """Float target distribution of one logits row: temperature, top-k, top-p (shared/sampling.py)."""
    return sampling.prepare([float(v) for v in logits], temperature, top_k, top_p)


def target_table(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0) -> list[int]:
    """Quantized target distribution (ints summing to ONE) of one logits row, for the acceptance rule."""
    return quantize(target_probs(logits, temperature, top_k, top_p))
