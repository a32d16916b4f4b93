"""The specmesh model family in PyTorch (float, for training), matching docs/CONTRACTS.md section 4.

llama-style decoder: RMSNorm, llama2.c RoPE on pairs (2i, 2i+1), grouped-query attention, SwiGLU,
optionally tied classifier. `CONFIGS` names the shipped shapes. `export_tensors` gives the float
tensors under the model file's names (shared/modelfile.py tensor_layout).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ModelArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden: int
    vocab: int = 512
    max_seq: int = 256
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    shared_cls: bool = True

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def to_dict(self) -> dict:
        return asdict(self)


CONFIGS = {
    # fits a classic ESP32: file ~46 KB, int8 KV cache 20 KB at max_seq 256
    "drafter": ModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden=96),
    # ~1.2 M parameters, for an ESP32-S3 with PSRAM or the host
    "target": ModelArgs(dim=128, n_layers=6, n_heads=4, n_kv_heads=2, hidden=352),
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(hd: int, n: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n, hd/2]: angle pos * theta^(-2i/hd) for pair i."""
    freqs = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.outer(torch.arange(n, dtype=torch.float64), freqs)
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x, cos, sin):
    """x [b, h, t, hd]; rotates each pair (2i, 2i+1) as llama2.c does."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        hd = a.head_dim
        self.a = a
        self.attn_norm = RMSNorm(a.dim, a.norm_eps)
        self.wq = nn.Linear(a.dim, a.n_heads * hd, bias=False)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * hd, bias=False)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * hd, bias=False)
        self.wo = nn.Linear(a.n_heads * hd, a.dim, bias=False)
        self.ffn_norm = RMSNorm(a.dim, a.norm_eps)
        self.w1 = nn.Linear(a.dim, a.hidden, bias=False)
        self.w2 = nn.Linear(a.hidden, a.dim, bias=False)
        self.w3 = nn.Linear(a.dim, a.hidden, bias=False)

    def forward(self, x, cos, sin):
        a, (b, t, _) = self.a, x.shape
        hd = a.head_dim
        h = self.attn_norm(x)
        q = self.wq(h).view(b, t, a.n_heads, hd).transpose(1, 2)
        k = self.wk(h).view(b, t, a.n_kv_heads, hd).transpose(1, 2)
        v = self.wv(h).view(b, t, a.n_kv_heads, hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        rep = a.n_heads // a.n_kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(y.transpose(1, 2).reshape(b, t, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Transformer(nn.Module):
    def __init__(self, a: ModelArgs):
        super().__init__()
        self.a = a
        self.tok_emb = nn.Embedding(a.vocab, a.dim)
        self.layers = nn.ModuleList(Block(a) for _ in range(a.n_layers))
        self.final_norm = RMSNorm(a.dim, a.norm_eps)
        self.cls = None if a.shared_cls else nn.Linear(a.dim, a.vocab, bias=False)
        cos, sin = rope_tables(a.head_dim, a.max_seq, a.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.apply(self._init)
        for n, p in self.named_parameters():  # GPT-2 style scaled init of residual projections
            if n.endswith(("wo.weight", "w2.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * a.n_layers))

    @staticmethod
    def _init(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.tok_emb(tokens)
        cos, sin = self.cos[:t], self.sin[:t]
        for layer in self.layers:
            x = layer(x, cos, sin)
        x = self.final_norm(x)
        w = self.tok_emb.weight if self.cls is None else self.cls.weight
        return x @ w.t()

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def export_tensors(model: Transformer) -> dict[str, np.ndarray]:
    """Float32 numpy tensors under the model file's names."""
    out = {"tok_emb": model.tok_emb.weight, "final_norm": model.final_norm.weight}
    for i, L in enumerate(model.layers):
        p = "layers.%d." % i
        out[p + "attn_norm"] = L.attn_norm.weight
        out[p + "ffn_norm"] = L.ffn_norm.weight
        for n in ("wq", "wk", "wv", "wo", "w1", "w2", "w3"):
            out[p + n] = getattr(L, n).weight
    if model.cls is not None:
        out["cls"] = model.cls.weight
    return {k: v.detach().float().cpu().numpy() for k, v in out.items()}
