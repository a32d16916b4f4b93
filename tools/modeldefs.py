"""The specmesh model family in PyTorch (float, for distillation), matching docs/CONTRACTS.md section 4.

llama-style decoder as llama2.c's: RMSNorm, RoPE on pairs (2i, 2i+1), grouped-query attention, SwiGLU,
optionally tied classifier. `DRAFTERS` names the drafter shapes tried (the model card reports each);
`from_model_file` loads a shipped int8 model (the target) as a float teacher; `export_tensors` gives
the float tensors under the model file's names (shared/modelfile.py tensor_layout).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from specmesh.tools import without_torch

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError as e:  # the `gpu` extra
    without_torch(e, __name__)

from specmesh.host.backends.modelio import read_model
from specmesh.host.decode.tokenizer import BOS
from specmesh.shared.modelfile import FLAG_SHARED_CLS


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


DRAFTERS = {  # drafter shapes distilled from the target (tok512 vocabulary; context 256, the training windows)
    "d32l2": ModelArgs(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden=96, max_seq=256),
    "d40l2kv1": ModelArgs(dim=40, n_layers=2, n_heads=4, n_kv_heads=1, hidden=96, max_seq=256),
    # 40 wide with heads of 8, the boards' fast attention path (firmware/native/kernels.c qk8, pv8): the classic ESP32's
    "d40l2h5kv1": ModelArgs(dim=40, n_layers=2, n_heads=5, n_kv_heads=1, hidden=96, max_seq=256),
    # two more shapes tried against it for that heap, not shipped (models/MODEL_CARD.md, "Drafter variants tried")
    "d40l3h5kv1": ModelArgs(dim=40, n_layers=3, n_heads=5, n_kv_heads=1, hidden=56, max_seq=256),
    "d48l2h6kv1": ModelArgs(dim=48, n_layers=2, n_heads=6, n_kv_heads=1, hidden=64, max_seq=256),
    "d48l2kv1": ModelArgs(dim=48, n_layers=2, n_heads=4, n_kv_heads=1, hidden=96, max_seq=256),
    "d48l2": ModelArgs(dim=48, n_layers=2, n_heads=4, n_kv_heads=2, hidden=128, max_seq=256),
    "d64l1": ModelArgs(dim=64, n_layers=1, n_heads=4, n_kv_heads=1, hidden=128, max_seq=256),
    "d64l2kv1": ModelArgs(dim=64, n_layers=2, n_heads=4, n_kv_heads=1, hidden=128, max_seq=256),
    # the target's own layer shape, fewer layers: a drafter for the host, which has the memory (started from
    # a subset of the target's layers: tools/train.py --init-layers)
    "t64l4": ModelArgs(dim=64, n_layers=4, n_heads=8, n_kv_heads=4, hidden=172, max_seq=256),
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

    def forward(self, x, cos, sin, cache: list | None = None, pos: int = 0):
        """x [b, t, dim] at positions pos..pos+t-1; with `cache` ([k, v] buffers [b, kv heads, max_seq,
        head_dim] holding positions < pos), attends to them as well and stores this call's keys and values."""
        a, (b, t, _) = self.a, x.shape
        hd = a.head_dim
        h = self.attn_norm(x)
        q = self.wq(h).view(b, t, a.n_heads, hd).transpose(1, 2)
        k = self.wk(h).view(b, t, a.n_kv_heads, hd).transpose(1, 2)
        v = self.wv(h).view(b, t, a.n_kv_heads, hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            cache[0][:, :, pos:pos + t], cache[1][:, :, pos:pos + t] = k, v
            k, v = cache[0][:, :, :pos + t], cache[1][:, :, :pos + t]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1, enable_gqa=True)
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

    def forward(self, tokens, cache: list | None = None, pos: int = 0):
        """Logits [b, t, vocab] of tokens [b, t] at positions pos..pos+t-1; `cache` (from
        `new_cache`) holds the keys and values of positions < pos (a multi-token call is causal
        within itself, so it needs pos 0 or t = 1)."""
        t = tokens.shape[1]
        x = self.tok_emb(tokens)
        cos, sin = self.cos[pos:pos + t], self.sin[pos:pos + t]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, None if cache is None else cache[i], pos)
        x = self.final_norm(x)
        w = self.tok_emb.weight if self.cls is None else self.cls.weight
        return x @ w.t()

    def new_cache(self, batch: int) -> list:
        a = self.a
        return [[torch.zeros(batch, a.n_kv_heads, a.max_seq, a.head_dim) for _ in "kv"] for _ in self.layers]

    @torch.no_grad()
    def sample(self, n: int, length: int, generator: torch.Generator, temperatures=(1.0,),
               openings: list[list[int]] | None = None) -> torch.Tensor:
        """n sequences [n, length + 1]: BOS, then `length` tokens sampled, the rows split evenly over
        `temperatures` (0: greedy; a story that ends runs on into the next, BOS between them, as the model was
        trained).
        With `openings` (n token lists from BOS, each shorter than length), row i starts with openings[i]
        and the model continues it, as it continues a user's prompt (its first token drawn at T = 1). Without, a row sampled cooler than 1
        starts at temperature 1 for a random 4 to 48 tokens, so its cool text continues varied openings."""
        seq = torch.full((n, length + 1), BOS, dtype=torch.long)
        cool = torch.tensor([temperatures[i * len(temperatures) // n] for i in range(n)])
        given = torch.zeros(n, dtype=torch.long)  # tokens each row opens with, not sampled
        if openings is None:
            warm_for = torch.where(cool < 1.0, torch.randint(4, 49, (n,), generator=generator), 0)
        else:
            warm_for = given
            for i, o in enumerate(openings):
                seq[i, :len(o)] = torch.tensor(o)
                given[i] = len(o)
        cache = self.new_cache(n)
        for pos in range(length):
            temp = torch.where(warm_for > pos, 1.0, cool)[:, None]
            logits = self(seq[:, pos:pos + 1], cache, pos)[:, -1].float()
            probs = torch.softmax(logits / temp.clamp_min(1e-6), -1)
            drawn = torch.multinomial(probs, 1, generator=generator)[:, 0]
            drawn = torch.where(temp[:, 0] > 0, drawn, logits.argmax(-1))  # T = 0: the greedy token
            seq[:, pos + 1] = torch.where(given > pos + 1, seq[:, pos + 1], drawn)
        return seq

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


class CheckpointError(ValueError):
    """Weights to start, resume or export from that cannot be used: a file that is no checkpoint of tools/train.py,
    or another shape's weights; the message names the file and says what to do."""


def read_pt(path) -> dict:
    """A checkpoint of tools/train.py (its dict: "model", "config", ...); CheckpointError for a file that is none (empty,
    cut short, another format): torch's own error for such a file is a traceback's worth of unpickler or zip detail."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=False)
    except OSError:  # missing or unreadable: said as any file is
        raise
    except Exception as e:  # noqa: BLE001 - torch.load raises whatever its unpickler or zip reader meets
        raise CheckpointError("%s is not a checkpoint of tools/train.py (%s): give a .pt that it wrote"
                              % (path, type(e).__name__)) from None
    if not isinstance(ck, dict) or not {"model", "config"} <= ck.keys():
        raise CheckpointError("%s is not a checkpoint of tools/train.py (no model and config in it): give a .pt that "
                              "it wrote" % (path,))
    return ck


def load_weights(model: Transformer, state: dict, source: str, shape: str, todo: str) -> None:
    """`state` into `model`; CheckpointError naming `source` and what to do (`todo`) where its names or sizes are
    another shape's (torch's own error lists every key and size, many lines)."""
    try:
        model.load_state_dict(state)
    except RuntimeError:
        raise CheckpointError("%s holds weights of another shape than %s: %s" % (source, shape, todo)) from None


def from_tensors(a: ModelArgs, tensors: dict) -> Transformer:
    """A float model (eval mode) from tensors under the model file's names (numpy float32, or int8 QTensors)."""
    m = Transformer(a)
    m.load_state_dict({name + ".weight": torch.from_numpy(v.dequant() if hasattr(v, "dequant") else v.copy())
                       for name, v in tensors.items()})
    return m.eval()


def from_model_file(path) -> Transformer:
    """The float model of an int8 model file (weights dequantized), in eval mode."""
    h, t = read_model(path)
    return from_tensors(ModelArgs(dim=h.dim, n_layers=h.n_layers, n_heads=h.n_heads, n_kv_heads=h.n_kv_heads,
                                  hidden=h.hidden, vocab=h.vocab, max_seq=h.max_seq, norm_eps=h.norm_eps,
                                  rope_theta=h.rope_theta, shared_cls=bool(h.flags & FLAG_SHARED_CLS)), t)


def layer_subset(state: dict, layers: list[int]) -> dict:
    """A state dict holding the embedding, final norm and classifier of `state` and its layers `layers`,
    renumbered 0, 1, ... in that order: a shallower model started from a deeper one's layers."""
    out = {}
    for name, v in state.items():
        if not name.startswith("layers."):
            out[name] = v
            continue
        i, rest = name.split(".", 2)[1:]
        if int(i) in layers:
            out["layers.%d.%s" % (layers.index(int(i)), rest)] = v
    return out


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


if __name__ == "__main__":
    from specmesh.tools import not_a_command

    not_a_command("modeldefs", "the PyTorch models are trained with python -m specmesh.tools.train and exported with python -m specmesh.tools.export")
