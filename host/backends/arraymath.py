"""The integer model arithmetic on arrays, written once for numpy and torch: `IntModel`, many streams.

docs/CONTRACTS.md section 4 defines the arithmetic; firmware/refkernels.py is its scalar reference and
firmware/kernels.py its viper form. Here every step is vectorised over all k positions of all streams
at once: exact int64 arithmetic (every product stays below 2^46), integer dot products as float64
matmuls (exact: every sum is below 2^31), so numpy, torch on the CPU and torch on CUDA give the
firmware's integers bit for bit, in any summation order. `Xp` is the handful of operations where
numpy and torch spell things differently; everything else is shared operator syntax.

`IntModel(path, xp)` holds the weights and a KV cache slot per stream: `open_stream`, `close_stream`,
`length`, `rollback`, and `forward([(slot, tokens), ...])`, one pass for every run (ragged runs are
packed for the per-position steps; attention pads them to the longest, with a causal mask over each
stream's own slot). It returns int64 Q16 logits, one [len(tokens), vocab] numpy array per run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specmesh.host.backends.modelio import QTensor, read_model
from specmesh.shared import intmath
from specmesh.shared.modelfile import FLAG_SHARED_CLS, Header

I64 = np.int64
EXP_TABLE = intmath.exp_table([0] * intmath.EXP_SIZE)


class Xp:
    """numpy spelled as the module needs it; `TorchXp` (host/backends/torch_backend.py) is the torch one."""

    name = "numpy"

    def asarray(self, a, dtype=I64):
        return np.asarray(a, dtype=dtype)

    def zeros(self, shape, int8=False):
        return np.zeros(shape, np.int8 if int8 else I64)

    def amax(self, a, axis=-1):
        return a.max(axis=axis, keepdims=True)

    def sum(self, a, axis=-1):
        return a.sum(axis=axis, keepdims=True)

    def clip(self, a, lo, hi):
        return np.clip(a, lo, hi)

    def where(self, c, a, b):
        return np.where(c, a, b)

    def einsum(self, spec, a, b):
        """An exact integer einsum (operands and sums below 2^53) through float64."""
        return np.einsum(spec, a.astype(np.float64), b.astype(np.float64)).astype(I64)

    def bitlen(self, m):
        """Bit length of non-negative ints below 2^53, elementwise: frexp's exponent (exact in float64)."""
        return np.frexp(m.astype(np.float64))[1].astype(I64)

    def floor_sqrt(self, a):
        r = np.floor(np.sqrt(a.astype(np.float64))).astype(I64)
        r = r - (r * r > a)
        return r + ((r + 1) * (r + 1) <= a)

    def int64(self, a):
        return a.astype(I64)

    def int8(self, a):
        return a.astype(np.int8)

    def swap(self, a, i: int, j: int):
        return np.swapaxes(a, i, j)

    def numpy(self, a) -> np.ndarray:
        return a


def rshr(a, s, xp: Xp):
    """round(a / 2^s), ties up, elementwise (a << -s where s <= 0)."""
    pos = xp.where(s > 0, s, 1)
    neg = xp.where(s > 0, 0, -s)
    return xp.where(s > 0, (a + (1 << (pos - 1))) >> pos, a << neg)


def mulsh(a, m, s, xp: Xp):
    return rshr(a * m, s, xp)


def quant(x, bits: int, xp: Xp):
    """Rows of x rounded to `bits`-bit ints by the row's least fitting shift: (values, shift [.., 1])."""
    sh = xp.bitlen(xp.amax(abs(x))) - bits
    sh = xp.where(sh > 0, sh, 0)
    lim = (1 << bits) - 1
    return xp.clip(rshr(x, sh, xp), -lim, lim), sh


def expq(d, tab, xp: Xp):
    """intmath.expq elementwise (d >= 0)."""
    dc = xp.where(d < intmath.EXP_SPAN, d, 0)
    e = (tab[dc >> 12] * tab[16 + ((dc >> 6) & 63)] + 16384) >> 15
    e = (e * tab[80 + (dc & 63)] + 16384) >> 15
    return xp.where(d < intmath.EXP_SPAN, e, 0)


class Mat:
    """A per-row int8 matrix: weights [cols, rows] and the rows' scales m / 2^s (intmath.fixed_packed)."""

    def __init__(self, qt: QTensor, xp: Xp):
        ms = np.array([intmath.fixed_packed(int(b)) for b in np.asarray(qt.s, np.float32).view(np.uint32)])
        self.q = xp.asarray(qt.q, dtype=np.int8)
        self.wt = xp.asarray(np.ascontiguousarray(qt.q.T))
        self.m = xp.asarray(ms & 0xFFFF)
        self.s = xp.asarray(ms >> 16)
        self.xp = xp

    def matvec(self, x):
        """W @ x for rows of Q16 x [n, cols] -> Q16 [n, rows]."""
        xp = self.xp
        xq, sh = quant(x, 15, xp)
        acc = xp.einsum("nc,cr->nr", xq, self.wt)
        return mulsh(acc, self.m, self.s - sh, xp)

    def embed(self, toks):
        """Rows toks of the matrix as Q16 activations."""
        return mulsh(self.xp.int64(self.q[toks]), self.m[toks][:, None], self.s[toks][:, None] - 16, self.xp)


class Norm:
    """An RMSNorm weight vector as ints with one shift (intmath.fixed_vector)."""

    def __init__(self, v: np.ndarray, h: Header, xp: Xp):
        ints = [int(b) for b in np.asarray(v, np.float32).view(np.int32)]
        self.qw = intmath.fixed_vector(ints)
        self.w = xp.asarray(ints)
        self.eps = intmath.eps_q32(h.norm_eps_bits)
        self.xp = xp

    def __call__(self, x):
        xp = self.xp
        dim = x.shape[-1]
        sh = xp.bitlen(xp.amax(abs(x))) - 10
        sh = xp.where(sh > 0, sh, 0)
        v = x >> sh
        t = xp.sum(v * v) // dim + (self.eps >> (2 * sh))
        n = (30 - xp.bitlen(t)) // 2
        n = xp.where(n > 0, n, 0)
        g = (1 << 28) // xp.where(t > 0, xp.floor_sqrt(t << (2 * n)), 1)
        y = mulsh(mulsh(x, self.w, self.qw, xp), g, 12 + sh - n, xp)
        return xp.where(t > 0, y, 0)


def silu(a, b, tab, xp: Xp):
    """mulsh(mulsh(a, sigmoid(a), 14), b rounded to 14 bits, 16 - shift): refkernels.silu."""
    b14, sh = quant(b, 14, xp)
    s = (1 << 29) // (32768 + expq(abs(a) >> 4, tab, xp))
    g = xp.where(a >= 0, s, (1 << 14) - s)
    return mulsh(mulsh(a, g, 14, xp), b14, 16 - sh, xp)


def rope(x, cs, sn, xp: Xp):
    """Rows x [n, heads*hd] rotated pairwise by the Q14 cos/sin rows [n, hd/2] of their positions."""
    n, half = cs.shape
    p = x.reshape(n, -1, half, 2)
    a, b = p[..., 0], p[..., 1]
    c, s = cs[:, None, :], sn[:, None, :]
    out = xp.zeros(p.shape)
    out[..., 0] = mulsh(a, c, 14, xp) - mulsh(b, s, 14, xp)
    out[..., 1] = mulsh(a, s, 14, xp) + mulsh(b, c, 14, xp)
    return out.reshape(x.shape)


def attention(q, kq, ke, vq, ve, visible, isq: int, tab, xp: Xp):
    """refkernels' scores, softmax and av, vectorised.

    q [..., j, g, hd] Q16 query heads (g heads share one kv head), kq/vq [..., t, hd] int8 keys and
    values with shifts ke/ve [..., t], visible [..., j, t] bool -> [..., j, g, hd] Q16.
    """
    qq, shq = quant(q, 15, xp)  # shq [..., j, g, 1]
    dot = xp.einsum("...jgd,...td->...jgt", qq, xp.int64(kq))
    sc = mulsh(dot, isq, 34 - shq - ke[..., None, None, :], xp)
    vis = visible[..., :, None, :]
    low = -(1 << 40)
    sc = xp.where(vis, sc, low)
    mx = xp.amax(sc)
    e = xp.where(vis, expq(mx - sc, tab, xp), 0)
    z = xp.sum(e)
    rz = (1 << 30) // xp.where(z > 0, z, 1 << 30)  # a padded query row sees nothing: all 0
    vm = xp.amax(xp.where(vis, ve[..., None, None, :], 0))
    s = 8 + vm - ve[..., None, None, :]
    a = xp.where(s <= 30, rshr(e * rz, xp.where(s <= 30, s, 30), xp), 0)
    o = xp.einsum("...jgt,...td->...jgd", a, xp.int64(vq))
    return rshr(o, 22 - vm, xp)


class IntModel:
    """A specmesh model file's integer transformer on numpy or torch, with a KV cache slot per stream."""

    def __init__(self, path, xp: Xp | None = None, streams: int = 1):
        self.xp = xp = xp or Xp()
        h, t = read_model(path)
        self.header = h
        self.tok_emb = Mat(t["tok_emb"], xp)
        self.layers = [{name.split(".", 2)[2]: (Mat(v, xp) if isinstance(v, QTensor) else Norm(v, h, xp))
                        for name, v in t.items() if name.startswith("layers.%d." % i)}
                       for i in range(h.n_layers)]
        self.final_norm = Norm(t["final_norm"], h, xp)
        self.cls = self.tok_emb if h.flags & FLAG_SHARED_CLS else Mat(t["cls"], xp)
        hd = h.head_dim
        tab = intmath.rope_table(h.rope_theta_bits, hd, h.max_seq, [0] * intmath.rope_size(hd, h.max_seq))
        cs = np.array([[intmath.rope_at(tab, hd, p, i) for i in range(hd // 2)] for p in range(h.max_seq)])
        self.cos, self.sin = xp.asarray(cs[..., 0]), xp.asarray(cs[..., 1])  # [max_seq, hd / 2]
        self.exp_tab = xp.asarray(EXP_TABLE)
        self.isq = intmath.isqrt((1 << 28) // h.head_dim)
        self._lengths: list[int | None] = []  # per slot: cached positions, None when free
        self._cache: tuple | None = None  # int8 keys, key shifts, int8 values, value shifts
        self._grow(max(1, streams))

    @property
    def vocab(self) -> int:
        return self.header.vocab

    # -- streams ---------------------------------------------------------------------------------

    def _grow(self, cap: int) -> None:
        h, xp = self.header, self.xp
        shape = (h.n_layers, cap, h.max_seq)
        new = tuple(xp.zeros(shape + ((h.kv_dim,) if i % 2 == 0 else ()), int8=i % 2 == 0) for i in range(4))
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

        Returns per run the int64 Q16 logits [len(tokens), vocab]; row i predicts the token after
        tokens[i]. Every run is checked before any cache changes; a slot may appear once per call.
        """
        h = self.header
        slots = [s for s, _ in runs]
        if not runs or len(set(slots)) != len(slots):
            raise ValueError("a forward batch needs one run per stream, at least one")
        starts = [self.length(s) for s in slots]
        counts = [len(toks) for _, toks in runs]
        for s, n0, n in zip(slots, starts, counts):
            if n < 1:
                raise ValueError("forward needs at least one token")
            if n0 + n > h.max_seq:
                raise ValueError("stream %d: %d positions after %d exceed the model's context of %d"
                                 % (s, n, n0, h.max_seq))
        flat = [int(t) for _, toks in runs for t in toks]
        if min(flat) < 0 or max(flat) >= h.vocab:
            raise ValueError("token id out of range [0, %d)" % h.vocab)
        logits = self.xp.numpy(self._forward(slots, starts, counts, flat))
        for s, n0, n in zip(slots, starts, counts):
            self._lengths[s] = n0 + n
        return np.split(logits, np.cumsum(counts)[:-1])

    def _forward(self, slots, starts, counts, flat):
        h, xp, hd = self.header, self.xp, self.header.head_dim
        b, t_max, l_max = len(slots), max(counts), max(n0 + n for n0, n in zip(starts, counts))
        n_kv, group = h.n_kv_heads, h.n_heads // h.n_kv_heads
        # per packed row: token, stream, index in its run, position, cache slot
        row_b = np.repeat(np.arange(b), counts)
        row_t = np.arange(len(flat)) - (np.cumsum(counts) - counts)[row_b]
        pos = np.asarray(starts)[row_b] + row_t
        toks, row_b, row_t, pos, row_slot = xp.asarray(np.stack([flat, row_b, row_t, pos, np.asarray(slots)[row_b]]))
        slots_t = xp.asarray(slots)
        # key i is visible to query t of stream b iff i <= starts[b] + t: causal, in b's own slot only
        visible = (np.arange(l_max)[None, None, :]
                   <= (np.asarray(starts)[:, None] + np.arange(t_max)[None, :])[:, :, None])
        visible = xp.asarray(visible, dtype=bool)
        cos, sin = self.cos[pos], self.sin[pos]
        x = self.tok_emb.embed(toks)
        for i, w in enumerate(self.layers):
            xn = w["attn_norm"](x)
            q = rope(w["wq"].matvec(xn), cos, sin, xp)
            kq, ke = quant(rope(w["wk"].matvec(xn), cos, sin, xp), 7, xp)
            vq, ve = quant(w["wv"].matvec(xn), 7, xp)
            kc, kec, vc, vec = self._cache
            kc[i, row_slot, pos], kec[i, row_slot, pos] = xp.int8(kq), ke[:, 0]
            vc[i, row_slot, pos], vec[i, row_slot, pos] = xp.int8(vq), ve[:, 0]
            keys = xp.swap(kc[i, slots_t, :l_max].reshape(b, l_max, n_kv, hd), 1, 2)  # [b, kv head, t, hd]
            vals = xp.swap(vc[i, slots_t, :l_max].reshape(b, l_max, n_kv, hd), 1, 2)
            qp = xp.zeros((b, t_max, h.n_heads * hd))
            qp[row_b, row_t] = q
            o = attention(xp.swap(qp.reshape(b, t_max, n_kv, group, hd), 1, 2), keys, kec[i, slots_t, None, :l_max],
                          vals, vec[i, slots_t, None, :l_max], visible[:, None], self.isq, self.exp_tab, xp)
            o = xp.swap(o, 1, 2).reshape(b, t_max, h.n_heads * hd)[row_b, row_t]
            x = x + w["wo"].matvec(o)
            xn = w["ffn_norm"](x)
            x = x + w["w2"].matvec(silu(w["w1"].matvec(xn), w["w3"].matvec(xn), self.exp_tab, xp))
        return self.cls.matvec(self.final_norm(x))
