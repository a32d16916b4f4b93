"""The firmware inference engine: a specmesh int8 model run by MicroPython, with an int8 KV cache.

API (used by the node and its roles; `firmware/` is the board's root, `shared/` a package beside it):

    e = Engine(path, kmax=1, viper=True, n_ctx=0)  # load; kmax = most positions one forward() takes;
                                          # n_ctx > 0 caps the context (and KV cache) below max_seq
    logits = e.forward(tokens, pos)       # k = len(tokens) <= kmax ids at positions pos .. pos+k-1;
                                          # returns the engine's array('f'): row j at [j*vocab, (j+1)*vocab)
    e.argmax(j)                           # greedy token of row j (ties: lowest id)
    e.rollback(n)                         # keep the first n positions (n >= length: no-op)
    e.length, e.n_ctx, e.vocab, e.header  # cached positions, context size, vocabulary, model header
    e.heap_bytes                          # heap the loaded engine holds (weights + KV cache + buffers)
    e.viper                               # True when the viper kernels run, False on the Python fallback

`forward` needs pos <= length (an earlier pos rolls back first). The returned array is overwritten by
the next call. A prompt longer than kmax is fed in chunks. Every buffer is allocated by the constructor
(largest first, with no temporary copies, against fragmentation); the token loop creates no lists,
arrays or other objects that outlive a call, so the heap holds still token after token (tested). What
it cannot avoid: MicroPython floats are heap objects (on the ESP32 ports too), so each float operation
of the norms, softmax, RoPE and output scaling allocates a short-lived box that the GC reclaims
(`python -m tools.bench kernels` reports the bytes per token). Integer work never allocates.

Arithmetic: docs/CONTRACTS.md section 4 describes this engine's steps exactly; host/engine.py (numpy)
and host/torch_backend.py reproduce them bit for bit on the unix port, where floats are doubles and
every array('f') store rounds to float32 (on boards floats are float32, so there the host is matched
to float32 rounding only). Matmuls run int8 x int8 -> int32 in `kernels.py` (viper) or in the
plain-Python fallback below. Attention stays integer too, at float precision: each query head becomes
30-bit ints (scale max|q|/(2^30-1)), split into two int16 halves for the q.k products against the int8
key cache; softmax weights times value scales are quantized to sum to 2^23 for the products against
the int8 value cache. Integer bounds (32-bit boards: int32 in viper, 31-bit small ints in Python):
matmul sums 127*127*cols, q.k halves 32768*127*hd, value sums 127*(2^23 + n_ctx); so hd <= 256
(checked at load) and cols < 66000.
"""

import gc
import math
from array import array

from micropython import const

from shared.modelfile import (FLAG_SHARED_CLS, HEADER_SIZE, KIND_Q8, ModelFileError, crc32,
                              parse_header, tensor_layout)

try:
    import kernels as _kernels
except Exception:  # no native emitter on this port (or viper disabled in the build)
    _kernels = None

_QMAX = const(1073741823)  # query scale: 30-bit ints, split into two int16 halves for the q.k kernel
_WSUM = 8388608.0  # attention weights are quantized to sum to 2^23
_MAX_HD = const(256)


# Plain-Python kernels: the same signatures and results as kernels.py, for ports without viper.

def _matmul_py(acc, w, x, p):
    rows = p[0]
    cols = p[1]
    for j in range(p[2]):
        xo = j * cols
        ao = j * rows
        for r in range(rows):
            wo = (p[3] + r) * cols
            a = 0
            for c in range(cols):
                a += ((w[wo + c] ^ 128) - 128) * ((x[xo + c] ^ 128) - 128)
            acc[ao + r] = a


def _qk_py(out, kc, q, p):
    hd = p[1]
    for t in range(p[0]):
        b = t * p[2] + p[3]
        hi = 0
        lo = 0
        for i in range(hd):
            k = (kc[b + i] ^ 128) - 128
            hi += q[i] * k
            lo += q[hd + i] * k
        out[2 * t] = hi
        out[2 * t + 1] = lo


def _av_py(out, vc, wt, p):
    hd = p[1]
    for i in range(hd):
        out[i] = 0
    for t in range(p[0]):
        a = wt[t]
        if a:
            b = t * p[2] + p[3]
            for i in range(hd):
                out[i] += a * ((vc[b + i] ^ 128) - 128)


def _absmax_py(a, p):
    best = p[0]
    m = 0.0
    for i in range(p[0], p[0] + p[1]):
        v = abs(a[i])
        if v > m:
            m = v
            best = i
    return best


def _argmax_py(a, p):
    off = p[0]
    best = 0
    m = a[off]
    if m != m:
        return -1
    for i in range(1, p[1]):
        v = a[off + i]
        if v > m:
            m = v
            best = i
        elif v != v:
            return -1
    return best


def _f32(n):
    """A zeroed array('f') of n, allocated once (array(range) sizes it up front; no temporary buffer)."""
    a = array("f", range(n))
    for i in range(n):
        a[i] = 0.0
    return a


def _i32(n):
    a = array("i", range(n))
    for i in range(n):
        a[i] = 0
    return a


class Engine:
    """One sequence of one model: weights, int8 KV cache and every scratch buffer, allocated here."""

    def __init__(self, path, kmax=1, viper=True, n_ctx=0):
        if kmax < 1:
            raise ValueError("kmax must be >= 1")
        gc.collect()
        before = gc.mem_alloc()
        self.viper = bool(viper) and _kernels is not None
        kern = _kernels if self.viper else None
        self._mm = kern.matmul if kern else _matmul_py
        self._qk = kern.qk if kern else _qk_py
        self._av = kern.av if kern else _av_py
        self._amax = kern.absmax if kern else _absmax_py
        self._scale = kern.scale if kern else self._scale_py
        self._q8 = kern.quant8 if kern else self._quant8_py
        self._argmax = kern.argmax if kern else _argmax_py
        with open(path, "rb") as f:
            h = parse_header(f.read(HEADER_SIZE))
            if h.head_dim > _MAX_HD:
                raise ModelFileError("model head size %d exceeds this engine's int32 bound (%d)"
                                     % (h.head_dim, _MAX_HD))
            self.header = h
            self.kmax = kmax
            self.vocab = h.vocab
            self.n_ctx = min(n_ctx, h.max_seq) if n_ctx > 0 else h.max_seq
            self.length = 0
            self._buffers(h, kmax)  # the largest first, before the weights, against fragmentation
            t = self._load(f, h)
        # t follows tensor_layout: tok_emb, 9 tensors per layer, final_norm, [cls]
        self.tok_emb = t[0]
        self.layers = [tuple(t[1 + 9 * i:10 + 9 * i]) for i in range(h.n_layers)]
        self.final_norm = t[1 + 9 * h.n_layers]
        self.cls = t[0] if h.flags & FLAG_SHARED_CLS else t[2 + 9 * h.n_layers]
        gc.collect()
        self.heap_bytes = gc.mem_alloc() - before

    def _buffers(self, h, kmax):
        hd, dim, kvd, hid = h.head_dim, h.dim, h.kv_dim, h.hidden
        qd = h.n_heads * hd
        cache = h.n_layers * self.n_ctx
        self.kc, self.vc = bytearray(cache * kvd), bytearray(cache * kvd)
        self.ks, self.vs = _f32(cache), _f32(cache)
        self.logits = _f32(kmax * h.vocab)
        self.block = max(dim, qd, hid)  # matrix rows per matmul call: the classifier goes in blocks
        self.acc = _i32(kmax * self.block)
        self.yb = _f32(kmax * dim)  # wo and w2 outputs, before the residual add
        self.h1, self.h3 = _f32(kmax * hid), _f32(kmax * hid)
        self.sc, self.si = _f32(self.n_ctx), _i32(2 * self.n_ctx)  # si: q.k sums, then attention weights
        self.x, self.xn = _f32(kmax * dim), _f32(kmax * dim)
        self.qb, self.ob = _f32(kmax * qd), _f32(kmax * qd)
        self.kb, self.vb = _f32(kmax * kvd), _f32(kmax * kvd)
        self.xq, self.xs = bytearray(kmax * max(dim, qd, hid)), _f32(kmax)
        self.cos, self.sin = _f32(kmax * hd // 2), _f32(kmax * hd // 2)
        self.qh, self.oi = array("h", range(2 * hd)), _i32(hd)
        self.p, self.pa, self.ps, self.pq = _i32(4), _i32(2), _i32(5), _i32(3)
        self.f1, self.f2 = _f32(1), _f32(1)
        self.freqs = _f32(hd // 2)
        for i in range(hd // 2):
            self.freqs[i] = math.pow(h.rope_theta, -2.0 * i / hd)
        self.inv_sqrt_hd = 1.0 / math.sqrt(hd)

    @staticmethod
    def _load(f, h):
        """Read every tensor into a fresh buffer, checking sizes and the body CRC; tensors in file order.

        A Q8 tensor is (int8 bytearray, float32 scales, rows, cols); a vector an array('f').
        """
        crc = 0
        layout = tensor_layout(h)
        out = [None] * len(layout)
        for n, (_name, kind, rows, cols) in enumerate(layout):
            if kind == KIND_Q8:
                w, s = bytearray(rows * cols), _f32(rows)
                crc = _read(f, w, rows * cols, crc)
                crc = _read(f, s, 4 * rows, crc)
                out[n] = (w, s, rows, cols)
            else:
                v = _f32(cols)
                crc = _read(f, v, 4 * cols, crc)
                out[n] = v
        if f.read(1):
            raise ModelFileError("model file has trailing bytes after its tensors: the file is corrupt")
        if crc is not None and crc != h.body_crc:
            raise ModelFileError("model file fails its CRC check: the file is corrupt, copy it again")
        return out

    def rollback(self, n):
        """Keep the first n cached positions."""
        if n < 0:
            raise ValueError("rollback length must be >= 0")
        if n < self.length:
            self.length = n

    def argmax(self, j=0):
        """Token id of the largest logit in row j; ties go to the lowest id; ValueError on a NaN logit."""
        pa = self.pa
        pa[0] = j * self.vocab
        pa[1] = self.vocab
        t = self._argmax(self.logits, pa)
        if t < 0:
            raise ValueError("nan")  # (a static qstr: no heap on a board)
        return t

    def forward(self, tokens, pos):
        """Run k = len(tokens) positions from pos in one batched pass; returns the logits array."""
        h = self.header
        k = len(tokens)
        if k < 1 or k > self.kmax:
            raise ValueError("forward takes 1..%d tokens, got %d" % (self.kmax, k))
        if pos < 0 or pos > self.length:
            raise ValueError("start position %d is beyond the %d cached positions" % (pos, self.length))
        if pos + k > self.n_ctx:
            raise ValueError("%d positions exceed the model's context of %d" % (pos + k, self.n_ctx))
        dim = h.dim
        x = self.x
        ew, es = self.tok_emb[0], self.tok_emb[1]
        for j in range(k):
            t = tokens[j]
            if t < 0 or t >= self.vocab:
                raise ValueError("token id %d out of range [0, %d)" % (t, self.vocab))
            s = es[t]
            for i in range(dim):
                x[j * dim + i] = ((ew[t * dim + i] ^ 128) - 128) * s
        self._rope_tables(k, pos)
        for li in range(h.n_layers):
            self._layer(li, self.layers[li], k, pos)
        self._rmsnorm(x, self.xn, self.final_norm, k)
        self._matvec(self.cls, self.xn, self.logits, k, False)
        self.length = pos + k
        return self.logits

    # -- steps ----------------------------------------------------------------------------------

    def _layer(self, li, lw, k, pos):
        h = self.header
        attn_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3 = lw
        self._rmsnorm(self.x, self.xn, attn_norm, k)
        self._quant_rows(self.xn, h.dim, k)  # one quantized input for wq, wk and wv
        self._project(wq, self.qb, k, False)
        self._project(wk, self.kb, k, False)
        self._project(wv, self.vb, k, False)
        self._rope(self.qb, h.n_heads, k)
        self._rope(self.kb, h.n_kv_heads, k)
        kvd = h.kv_dim
        for j in range(k):
            c = li * self.n_ctx + pos + j
            self.ks[c] = self._quant(self.kb, j * kvd, kvd, self.kc, c * kvd)
            self.vs[c] = self._quant(self.vb, j * kvd, kvd, self.vc, c * kvd)
        for j in range(k):
            self._attend(li, j, pos + j + 1)
        self._matvec(wo, self.ob, self.x, k, True)
        self._rmsnorm(self.x, self.xn, ffn_norm, k)
        self._quant_rows(self.xn, h.dim, k)
        self._project(w1, self.h1, k, False)
        self._project(w3, self.h3, k, False)
        h1, h3 = self.h1, self.h3
        for i in range(k * h.hidden):
            a = h1[i]
            h1[i] = 0.0 if a < -80.0 else a / (1.0 + math.exp(-a)) * h3[i]
        self._matvec(w2, self.h1, self.x, k, True)

    def _attend(self, li, j, n):
        """Attention of query row j over cache positions 0..n-1 of layer li, into self.ob row j."""
        h = self.header
        hd, kvd = h.head_dim, h.kv_dim
        group = h.n_heads // h.n_kv_heads
        qd = h.n_heads * hd
        base = li * self.n_ctx
        qh, sc, si, oi, p = self.qh, self.sc, self.si, self.oi, self.p
        ks, vs, ob = self.ks, self.vs, self.ob
        p[0] = n
        p[1] = hd
        p[2] = kvd
        for hh in range(h.n_heads):
            qo = j * qd + hh * hd
            qs = self._quant_q(qo, hd)
            p[3] = base * kvd + (hh // group) * hd
            self._qk(si, self.kc, qh, p)
            c = qs * self.inv_sqrt_hd
            mx = -1e30
            for t in range(n):
                s = (si[2 * t] * 32768.0 + si[2 * t + 1]) * ks[base + t] * c
                sc[t] = s
                if s > mx:
                    mx = s
            z = 0.0
            ws = 0.0
            for t in range(n):
                e = math.exp(sc[t] - mx)
                z += e
                w = e * vs[base + t]
                sc[t] = w
                ws += w
            if ws > 0.0:
                g = _WSUM / ws
                for t in range(n):
                    si[t] = math.floor(sc[t] * g + 0.5)
                self._av(oi, self.vc, si, p)
                f = ws / (_WSUM * z)
                for i in range(hd):
                    ob[qo + i] = oi[i] * f
            else:
                for i in range(hd):
                    ob[qo + i] = 0.0

    def _matvec(self, m, src, dst, k, add):
        """dst rows (+)= (Wq @ quant(src row)) * ws * xs for k rows of src."""
        self._quant_rows(src, m[3], k)
        self._project(m, dst, k, add)

    def _quant_rows(self, src, cols, k):
        """self.xq, self.xs = int8 rows and scales of k rows of src (the input of the next _project)."""
        for j in range(k):
            self.xs[j] = self._quant(src, j * cols, cols, self.xq, j * cols)

    def _project(self, m, dst, k, add):
        """dst rows (+)= (Wq @ self.xq row) * ws * xs: the matvec of rows quantized by _quant_rows.

        y = f32(f32(acc) * ws) * xs, rounded as float32 hardware (and numpy) rounds; with `add` the
        k rows of y (rows <= block) are added to dst.
        """
        w, ws, rows, cols = m
        p, ps = self.p, self.ps
        p[1] = cols
        p[2] = k
        ps[1] = k
        r0 = 0
        while r0 < rows:
            n = min(self.block, rows - r0)
            p[0] = n
            p[3] = r0
            self._mm(self.acc, w, self.xq, p)
            ps[0] = n
            ps[2] = r0
            if add:
                ps[3] = n
                ps[4] = 0
                self._scale(self.yb, self.acc, ws, self.xs, ps)
            else:
                ps[3] = rows
                ps[4] = r0
                self._scale(dst, self.acc, ws, self.xs, ps)
            r0 += n
        if add:
            yb = self.yb
            for i in range(k * rows):
                dst[i] += yb[i]

    def _scale_py(self, dst, acc, ws, xs, p):
        """kernels.scale in Python: float32 rounding of the first product through a float32 slot."""
        n, r0, stride, d0 = p[0], p[2], p[3], p[4]
        f = self.f1
        for j in range(p[1]):
            s = xs[j]
            for r in range(n):
                f[0] = acc[j * n + r] * ws[r0 + r]
                dst[j * stride + d0 + r] = f[0] * s

    def _absmax(self, src, so, n):
        """max |src[so:so+n]|."""
        pa = self.pa
        pa[0] = so
        pa[1] = n
        return abs(src[self._amax(src, pa)])

    def _quant(self, src, so, n, dst, do):
        """dst[do:do+n] = int8 of src[so:so+n] (scale max|x|/127, floor(x/xs + 0.5)); returns the scale."""
        m = self._absmax(src, so, n)
        if m == 0.0:
            for i in range(do, do + n):
                dst[i] = 0
            return 0.0
        r = self.f1  # the scale rounded to float32, as the reference has it
        r[0] = m / 127.0
        pq = self.pq
        pq[0] = so
        pq[1] = n
        pq[2] = do
        self._q8(dst, src, r, pq)
        return r[0]

    def _quant8_py(self, dst, src, sc, p):
        """kernels.quant8 in Python: the quotient rounded to float32 through a float32 slot."""
        s = sc[0]
        f = self.f2
        so, do = p[0], p[2]
        for i in range(p[1]):
            f[0] = src[so + i] / s
            v = math.floor(f[0] + 0.5)
            if v == 0 and f[0] == 0.4999999701976776:  # 0.5 - 2^-25: float32 rounds + 0.5 up to 1.0
                v = 1
            dst[do + i] = (127 if v > 127 else (-127 if v < -127 else v)) & 255

    def _quant_q(self, so, n):
        """Query head self.qb[so:so+n] as 30-bit ints v (scale max|q|/(2^30-1)), stored as two int16
        halves: self.qh[i] = v >> 15 (signed), self.qh[n+i] = v & 0x7FFF; returns the scale."""
        src, qh = self.qb, self.qh
        m = self._absmax(src, so, n)
        if m == 0.0:
            for i in range(2 * n):
                qh[i] = 0
            return 0.0
        s = m / _QMAX
        for i in range(n):
            v = math.floor(src[so + i] / s + 0.5)
            qh[i] = v >> 15
            qh[n + i] = v & 32767
        return s

    def _rmsnorm(self, src, dst, w, k):
        dim = self.header.dim
        eps = self.header.norm_eps
        for j in range(k):
            o = j * dim
            ss = 0.0
            for i in range(o, o + dim):
                ss += src[i] * src[i]
            d = math.sqrt(ss / dim + eps)
            for i in range(dim):
                dst[o + i] = src[o + i] * w[i] / d

    def _rope_tables(self, k, pos):
        half = self.header.head_dim // 2
        fr, cs, sn = self.freqs, self.cos, self.sin
        for j in range(k):
            for i in range(half):
                a = (pos + j) * fr[i]
                cs[j * half + i] = math.cos(a)
                sn[j * half + i] = math.sin(a)

    def _rope(self, buf, heads, k):
        """Rotate each pair (2i, 2i+1) of every head of k rows of buf by its position's angle."""
        half = self.header.head_dim // 2
        width = heads * half * 2
        cs, sn = self.cos, self.sin
        for j in range(k):
            for hh in range(heads):
                o = j * width + hh * half * 2
                for i in range(half):
                    c = cs[j * half + i]
                    s = sn[j * half + i]
                    a = buf[o + 2 * i]
                    b = buf[o + 2 * i + 1]
                    buf[o + 2 * i] = a * c - b * s
                    buf[o + 2 * i + 1] = a * s + b * c


def _read(f, buf, nbytes, crc):
    """readinto buf's nbytes entirely (else the file is truncated); returns the running CRC (None: no binascii)."""
    if f.readinto(buf) != nbytes:
        raise ModelFileError("model file is truncated: copy it again")
    return None if crc is None else crc32(buf, crc)
