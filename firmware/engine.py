"""The firmware inference engine: a specmesh int8 model run by MicroPython in integers, with an int8 KV cache.

API (used by the node and its roles; `firmware/` is the board's root, `shared/` a package beside it):

    e = Engine(path, kmax=1, viper=True, n_ctx=0, native=True)
                                          # load; kmax = most positions one forward() takes;
                                          # n_ctx > 0 caps the context (and KV cache) below max_seq;
                                          # viper False: plain Python kernels; native False: no C kernels
    logits = e.forward(tokens, pos)       # k = len(tokens) <= kmax ids at positions pos .. pos+k-1;
                                          # returns the engine's array('i') of Q16 logits:
                                          # row j at [j*vocab, (j+1)*vocab)
    e.forward(None, pos, k, head)         # a stage after the first: its input is the k rows of e.x
                                          # (the residual stream, Q16 int32, row j at [j*dim, (j+1)*dim));
                                          # the last stage computes logits only when head is true
    e.argmax(j)                           # greedy token of row j (ties: lowest id)
    e.rollback(n)                         # keep the first n positions (n >= length: no-op)
    e.exp_table                           # intmath.exp_table (a view of the engine's ints; for sampling)
    e.length, e.n_ctx, e.vocab, e.header  # cached positions, context size, vocabulary, model header
    e.crc                                 # the header's crc32: which build of its file it runs (HELLO)
    e.heap_bytes                          # heap the loaded engine holds (weights + KV cache + buffers;
                                          # a model on a ROMFS keeps its int8 weights in flash, not here)
    e.kernels                             # "native", "viper" or "python": the kernels it runs (kernelpick.py)
    e.viper                               # True when compiled kernels (native or viper) run, False on Python

A pipeline stage is firmware/stage_engine.py's StageEngine, this class with `layers=(a, b)`: it loads
only the tensors of layers a..b-1 (and the final norm on the last stage), reading the skipped bytes
through its KV cache buffer, before using it, for the CRC check; the embedding and the classifier stay
in the file, and its `_embed_row` and `_stream_cls` read them there. After a stage runs, e.x holds its
output residual stream, the next stage's input, exactly (no rounding between stages), so a chain of
stages gives the full model's logits bit for bit (docs/pipeline.md).

`forward` needs pos <= length (an earlier pos rolls back first). The returned array is overwritten by
the next call. A prompt longer than kmax is fed in chunks. Every buffer is allocated by the constructor
(largest first, against fragmentation); the token loop allocates nothing (only small ints, no floats:
tested with the GC disabled).

Arithmetic: docs/CONTRACTS.md section 4, all integer: Q16 activations, matmul inputs rounded to int16
by a per-row power-of-two shift, int8 weights with per-row 14-bit multipliers and shifts, RMSNorm by an
integer inverse square root, RoPE and exp (sigmoid too) from integer tables (shared/intmath.py), an int8
KV cache whose rows carry their power-of-two shift in one extra byte. Kernels: `native/<arch>.mpy` (C,
firmware/native/kernels.c), `kernels.py` (viper) or `refkernels.py` (plain Python), identical integers,
picked by kernelpick.py. host/backends/arraymath.py computes the same with numpy or
torch. Bounds (int32 on 32-bit boards): matmul sums 127 * 32767 * cols, so cols <= 516 and
head size <= 516 (checked at load); activations below 2^14 in Q16 (real values below 16384).
"""

import gc
from array import array

import kernelpick
from micropython import const

from shared import intmath
from shared.modelfile import (FLAG_SHARED_CLS, HEADER_SIZE, KIND_Q8, ModelFileError, crc32, parse_header,
                              tensor_bytes, tensor_layout)

_MAX_COLS = 516  # 127 * 32767 * 516 < 2^31

# The slots of the kernels' parameter arrays (firmware/kernels.py, each kernel's docstring), by name.
_NORM_DIM = const(0)  # rmsnorm: (dim, k, qw, eps)
_NORM_K = const(1)
_NORM_QW = const(2)
_NORM_EPS = const(3)
_ROPE_K = const(0)  # rope: (k, heads, half, pos0)
_ROPE_HEADS = const(1)
_ROPE_HALF = const(2)
_ROPE_POS = const(3)
_EMBED_DIM = const(0)  # embed: (dim, t, d0)
_EMBED_TOKEN = const(1)
_EMBED_AT = const(2)
_ARGMAX_OFF = const(0)  # argmax: (off, n)
_ARGMAX_N = const(1)
_ATT_SEEN = const(0)  # attend: (n, hd, stride, kb, vb, heads, group, isq, k, qq, tab)
_ATT_HD = const(1)
_ATT_STRIDE = const(2)
_ATT_KB = const(3)
_ATT_VB = const(4)
_ATT_HEADS = const(5)
_ATT_GROUP = const(6)
_ATT_ISQ = const(7)
_ATT_K = const(8)
_ATT_SCRATCH = const(9)
_ATT_TABLE = const(10)


def _zeros(code, n):
    """A zeroed array of n, allocated once (array(range) sizes it up front; no temporary buffer)."""
    a = array(code, range(n))
    for i in range(n):
        a[i] = 0
    return a


class Engine:
    """One sequence of one model: weights, int8 KV cache and every scratch buffer, allocated here."""

    def __init__(self, path, kmax=1, viper=True, n_ctx=0, layers=None, native=True):
        """layers=(a, b): StageEngine's slice (see the module docstring)."""
        if kmax < 1:
            raise ValueError("kmax must be >= 1")
        self.kern, self.kernels = kernelpick.pick(viper, native)  # before `before`: the kernels are code
        self.viper = self.kernels != "python"
        gc.collect()
        before = gc.mem_alloc()
        with open(path, "rb") as f:
            h = parse_header(f.read(HEADER_SIZE))
            if max(h.dim, h.hidden, h.n_heads * h.head_dim) > _MAX_COLS:
                raise ModelFileError("model width %d exceeds this engine's int32 bound (%d)"
                                     % (max(h.dim, h.hidden, h.n_heads * h.head_dim), _MAX_COLS))
            a, b = layers if layers is not None else (0, h.n_layers)
            if not 0 <= a < b <= h.n_layers:
                raise ModelFileError("layers %d:%d are not a slice of the model's %d layers" % (a, b, h.n_layers))
            self.header = h
            self.kmax = kmax
            self.vocab = h.vocab
            self.n_ctx = min(n_ctx, h.max_seq) if n_ctx > 0 else h.max_seq
            self.length = 0
            self.a, self.b = a, b
            self.head = b == h.n_layers  # final norm and classifier here
            self._buffers(h, kmax)  # the largest first, before the weights, against fragmentation
            t = self._load(f, h, a, b, None if layers is None else self.kv, _rom_view(f))
        # t follows tensor_layout: tok_emb, 9 tensors per layer, final_norm, [cls]; None where not loaded
        self.tok_emb = t[0]
        self.layers = [tuple(t[1 + 9 * i:10 + 9 * i]) for i in range(a, b)]
        self.final_norm = t[1 + 9 * h.n_layers]
        self.cls = t[0] if h.flags & FLAG_SHARED_CLS else t[2 + 9 * h.n_layers]
        self._tables(h)
        self._whole = None  # kernels that run a whole layer per call (the native module): its arguments
        if hasattr(self.kern, "layer"):
            self._whole = [(self._layer_buffers(lw), self._layer_params(h, li, lw))
                           for li, lw in enumerate(self.layers)]
        gc.collect()
        self.heap_bytes = gc.mem_alloc() - before

    def _buffers(self, h, kmax):
        hd, dim, kvd, hid = h.head_dim, h.dim, h.kv_dim, h.hidden
        qd = h.n_heads * hd
        self.stride = kvd + 1  # a cache row: kv_dim int8 values, then their shift
        self.cache = (self.b - self.a) * self.n_ctx * self.stride
        self.kv = bytearray(2 * self.cache)  # keys, then values
        self.logits = _zeros("i", kmax * h.vocab) if self.head else None
        self.block = max(dim, qd, hid)  # matrix rows per matmul call: the classifier goes in blocks
        self.pm = _zeros("i", 16 + kmax * self.block)  # matmul's parameters, then its sums
        self.acc = memoryview(self.pm)[16:]
        self.h1, self.h3 = _zeros("i", kmax * hid), _zeros("i", kmax * hid)
        self.xq = _zeros("i", kmax * max(dim, qd, hid) + 1)  # matmul inputs, positions interleaved; + slack
        self.sc = _zeros("i", self.n_ctx + hd + intmath.EXP_SIZE)  # scores, query scratch, exp table
        self.x, self.xn = _zeros("i", kmax * dim), _zeros("i", kmax * dim)
        self.qb = _zeros("i", kmax * qd)  # queries, then (in place) the attention outputs
        self.kb, self.vb = _zeros("i", kmax * kvd), _zeros("i", kmax * kvd)
        self.pr, self.pq = _zeros("i", 8 + kmax), _zeros("i", 8 + kmax)
        self.norm_p, self.rope_p, self.embed_p = _zeros("i", 4), _zeros("i", 4), _zeros("i", 3)
        self.argmax_p, self.attend_p, self.pl = _zeros("i", 2), _zeros("i", 11), _zeros("i", 2)

    def _layer_buffers(self, lw):
        """The buffers of one layer, in the order of the native `layer` kernel (firmware/native/kernels.c, L_*)."""
        attn_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3 = lw
        return (self.x, self.xn, self.xq, self.acc, self.pr, self.qb, self.kb, self.vb, self.kv, self.sc, self.h1,
                self.h3, self.rope_cs, self.exp_table, attn_norm[0], ffn_norm[0], wq[0], wq[1], wk[0], wk[1],
                wv[0], wv[1], wo[0], wo[1], w1[0], w1[1], w2[0], w2[1], w3[0], w3[1])

    def _layer_params(self, h, li, lw):
        """The native `layer` kernel's p: (k, pos, li, dim, head_dim, n_heads, n_kv_heads, hidden, n_ctx,
        stride, cache, isq, eps, attn_norm shift, ffn_norm shift); k and pos are set per call."""
        p = _zeros("i", 15)
        vals = (0, 0, li, h.dim, h.head_dim, h.n_heads, h.n_kv_heads, h.hidden, self.n_ctx, self.stride, self.cache,
                self.isq, self.eps, lw[0][1], lw[5][1])
        for i in range(15):
            p[i] = vals[i]
        return p

    def _tables(self, h):
        hd = h.head_dim
        self.rope_cs = intmath.rope_table(h.rope_theta_bits, hd, self.n_ctx,
                                          _zeros("h", intmath.rope_size(hd, self.n_ctx)))
        tab = self.n_ctx + hd
        intmath.exp_table(memoryview(self.sc)[tab:])
        self.exp_table = memoryview(self.sc)[tab:]
        self.isq = intmath.isqrt((1 << 28) // hd)  # 2^14 / sqrt(hd)
        self.eps = intmath.eps_q32(h.norm_eps_bits)

    @staticmethod
    def _load(f, h, a, b, scratch, rom=None):
        """Read the tensors of layers a..b-1 (all of them without `scratch`) into fresh buffers, checking
        sizes and the file's CRC (the body's, continued from the header's crc0: shared/modelfile.py parse_header);
        tensors in file order, None for a tensor not loaded. With `rom` (the file's memoryview, a ROMFS file:
        memory-mapped flash) the int8 weights stay where they are, views of it.

        With `scratch` (a stage) the embedding, the other layers and the classifier are read through it
        for the CRC only, and the final norm is loaded when b is the last layer.
        A Q8 tensor becomes (int8 bytearray or ROMFS view, array('i') of m | s << 16 per row, rows, cols), the row
        scale m / 2^s (intmath.fixed: 0 <= m <= 2^14); a vector (array('i') of ints, s), values int / 2^s.
        """
        crc = h.crc0
        layout = tensor_layout(h)
        out = [None] * len(layout)
        lo, hi = 1 + 9 * a, 1 + 9 * b + (1 if b == h.n_layers else 0)  # tensors kept by a stage
        for n, (_name, kind, rows, cols) in enumerate(layout):
            if scratch is not None and not lo <= n < hi:
                left = tensor_bytes(kind, rows, cols)
                while left:
                    c = min(left, len(scratch))
                    crc = _read(f, memoryview(scratch)[:c], c, crc)
                    left -= c
            elif kind == KIND_Q8:
                ms = _zeros("i", rows)
                if rom is None:
                    w = bytearray(rows * cols)
                    crc = _read(f, w, rows * cols, crc)
                else:
                    w, crc = _view(f, rom, rows * cols, crc)
                crc = _read(f, ms, 4 * rows, crc)
                for r in range(rows):
                    ms[r] = intmath.fixed_packed(ms[r])
                out[n] = (w, ms, rows, cols)
            else:
                v = _zeros("i", cols)
                crc = _read(f, v, 4 * cols, crc)
                out[n] = (v, intmath.fixed_vector(v))
        if f.read(1):
            raise ModelFileError("model file has trailing bytes after its tensors: the file is corrupt")
        if crc is not None and crc != h.crc:
            raise ModelFileError("model file fails its CRC check: the file is corrupt, copy it again")
        return out

    @property
    def crc(self):
        """The model file's crc32 from its header (HELLO reports it). Named `crc`, a name the node's modules already
        hold: a new name (body_crc) in node.py grew an idle node's qstr pool at boot, 6 KB on a classic ESP32's
        heap, which then ran out (tests/test_node.py)."""
        return self.header.crc

    def rollback(self, n):
        """Keep the first n cached positions."""
        if n < 0:
            raise ValueError("rollback length must be >= 0")
        if n < self.length:
            self.length = n

    def argmax(self, j=0):
        """Token id of the largest logit in row j; ties go to the lowest id."""
        p = self.argmax_p
        p[_ARGMAX_OFF] = j * self.vocab
        p[_ARGMAX_N] = self.vocab
        return self.kern.argmax(self.logits, p)

    def forward(self, tokens, pos, k=0, head=True):
        """Run k = len(tokens) positions from pos in one batched pass; returns the logits array.

        tokens None (a stage after the first): the k rows of self.x are the input. The logits are computed
        on the last stage only, and there only when `head`; otherwise self.x is the output."""
        h = self.header
        if tokens is not None:
            k = len(tokens)
        if k < 1 or k > self.kmax:
            raise ValueError("forward takes 1..%d tokens, got %d" % (self.kmax, k))
        if pos < 0 or pos > self.length:
            raise ValueError("start position %d is beyond the %d cached positions" % (pos, self.length))
        if pos + k > self.n_ctx:
            raise ValueError("%d positions exceed the model's context of %d" % (pos + k, self.n_ctx))
        if (tokens is None) != (self.a > 0):
            raise ValueError("the first stage takes tokens, a later one activations")
        pe = self.embed_p
        pe[_EMBED_DIM] = h.dim
        for j in range(k if tokens is not None else 0):
            t = tokens[j]
            if t < 0 or t >= self.vocab:
                raise ValueError("token id %d out of range [0, %d)" % (t, self.vocab))
            pe[_EMBED_AT] = j * h.dim
            if self.tok_emb is None:  # a stage: StageEngine reads the row from the file
                self._embed_row(t)
            else:
                pe[_EMBED_TOKEN] = t
                self.kern.embed(self.x, self.tok_emb[0], self.tok_emb[1], pe)
        for li in range(self.b - self.a):
            self._layer(li, self.layers[li], k, pos)
        if self.head and head:
            self._rmsnorm(self.final_norm, k)
            if self.cls is None:  # a stage not holding it: StageEngine streams the classifier from the file
                self._stream_cls(k)
            else:
                self._matvec(self.cls, self.xn, self.logits, k, 0)
        self.length = pos + k
        return self.logits

    # -- steps ----------------------------------------------------------------------------------

    def _layer(self, li, lw, k, pos):
        if self._whole is not None:  # the native kernels: the steps below in one call
            bufs, p = self._whole[li]
            p[0] = k
            p[1] = pos
            self.kern.layer(bufs, p)
            return
        h = self.header
        kern = self.kern
        attn_norm, wq, wk, wv, wo, ffn_norm, w1, w2, w3 = lw
        self._rmsnorm(attn_norm, k)
        self._quant_rows(self.xn, h.dim, k)  # one quantized input for wq, wk and wv
        self._project(wq, self.qb, k, 0)
        self._project(wk, self.kb, k, 0)
        self._project(wv, self.vb, k, 0)
        po = self.rope_p
        po[_ROPE_K] = k
        po[_ROPE_HALF] = h.head_dim // 2
        po[_ROPE_POS] = pos
        po[_ROPE_HEADS] = h.n_heads
        kern.rope(self.qb, self.rope_cs, po)
        po[_ROPE_HEADS] = h.n_kv_heads
        kern.rope(self.kb, self.rope_cs, po)
        kvd = h.kv_dim
        pq = self.pq  # the k new rows of keys, then of values, into the cache
        pq[0] = 0
        pq[1] = kvd
        pq[2] = (li * self.n_ctx + pos) * self.stride
        pq[3] = 7
        pq[4] = 1
        pq[5] = k
        pq[6] = self.stride
        kern.quant(self.kv, self.kb, pq)
        pq[2] += self.cache
        kern.quant(self.kv, self.vb, pq)
        pa = self.attend_p
        pa[_ATT_HD] = h.head_dim
        pa[_ATT_STRIDE] = self.stride
        pa[_ATT_KB] = li * self.n_ctx * self.stride
        pa[_ATT_VB] = self.cache + pa[_ATT_KB]
        pa[_ATT_HEADS] = h.n_heads
        pa[_ATT_GROUP] = h.n_heads // h.n_kv_heads
        pa[_ATT_ISQ] = self.isq
        pa[_ATT_SCRATCH] = self.n_ctx
        pa[_ATT_TABLE] = self.n_ctx + h.head_dim
        pa[_ATT_SEEN] = pos + 1  # query j sees positions 0 .. pos + j
        pa[_ATT_K] = k
        kern.attend(self.qb, self.kv, self.sc, pa)
        self._matvec(wo, self.qb, self.x, k, 1)
        self._rmsnorm(ffn_norm, k)
        self._quant_rows(self.xn, h.dim, k)
        self._project(w1, self.h1, k, 0)
        self._project(w3, self.h3, k, 0)
        pl = self.pl
        pl[0] = h.hidden
        pl[1] = k
        kern.silu(self.h1, self.h3, self.exp_table, pl)
        self._matvec(w2, self.h1, self.x, k, 1)

    def _rmsnorm(self, w, k):
        """self.xn = RMSNorm of k rows of self.x with weights w = (ints, shift)."""
        pn = self.norm_p
        pn[_NORM_DIM] = self.header.dim
        pn[_NORM_K] = k
        pn[_NORM_QW] = w[1]
        pn[_NORM_EPS] = self.eps
        self.kern.rmsnorm(self.xn, self.x, w[0], pn)

    def _matvec(self, m, src, dst, k, add):
        """dst rows (+)= W @ src rows, for k rows of src."""
        self._quant_rows(src, m[3], k)
        self._project(m, dst, k, add)

    def _quant_rows(self, src, cols, k):
        """self.xq = k rows of src rounded to int16 (interleaved: row j's value c at c*k + j), their
        shifts in self.pr[8:], where _project's requant reads them."""
        pr = self.pr
        pr[0] = 0
        pr[1] = cols
        pr[2] = 0
        pr[3] = 15
        pr[4] = k
        pr[5] = k
        pr[6] = 1
        self.kern.quant(self.xq, src, pr)

    def _project(self, m, dst, k, add):
        """dst rows (+)= requant(Wq @ self.xq rows): the matvec of rows quantized by _quant_rows.

        The classifier (rows > block) goes in blocks of `block` rows through self.acc."""
        w, ms, rows, cols = m
        r0 = 0
        while r0 < rows:
            n = min(self.block, rows - r0)
            self._block(w, ms, n, cols, r0, dst, k, r0, rows, add)
            r0 += n

    def _block(self, w, ms, n, cols, w0, dst, k, d0, rows, add):
        """dst rows d0..d0+n-1 (of `rows` per position) (+)= requant of weight rows w0..w0+n-1 @ self.xq."""
        pm, pr = self.pm, self.pr
        pm[0] = pr[0] = n
        pm[1] = cols
        pm[2] = k
        pm[3] = pr[2] = w0
        pr[1] = k
        pr[3] = rows
        pr[4] = d0
        pr[5] = add
        self.kern.matmul(w, self.xq, 0, pm)
        self.kern.requant(dst, self.acc, ms, pr)


def _rom_view(f):
    """The memoryview of a file on a ROMFS (memory-mapped flash: its bytes never come to the heap), else None."""
    try:
        return memoryview(f)
    except TypeError:  # a file on a read-write filesystem (or CPython's): no buffer to view
        return None


def _view(f, rom, nbytes, crc):
    """(the next nbytes of the file as a view of `rom`, the running CRC), the file moved past them."""
    at = f.tell()
    if at + nbytes > len(rom):
        raise ModelFileError("model file is truncated: copy it again")
    f.seek(at + nbytes)
    w = rom[at:at + nbytes]
    return w, None if crc is None else crc32(w, crc)


def _read(f, buf, nbytes, crc):
    """readinto buf's nbytes entirely (else the file is truncated); returns the running CRC (None: no binascii)."""
    if f.readinto(buf) != nbytes:
        raise ModelFileError("model file is truncated: copy it again")
    return None if crc is None else crc32(buf, crc)
