"""The specmesh model file: header layout, tensor order and sizes, shared by boards and host.

Runs unchanged under MicroPython and CPython. A reader parses the header with `read_header`,
then walks `tensor_layout(h)` and `readinto`s each tensor into a buffer it preallocated.
The layout is documented in docs/CONTRACTS.md section 3.
"""

import struct

MAGIC = b"SPMM"
VERSION = 2  # what writers write; readers take 1 too. Version 2's crc32 covers the header's bytes before it, then the
# body, so a flipped header bit fails the CRC as a body bit does (version 1's covered the body only: a flipped rope_theta
# ran and gave garbage). The same layout, so a reader starts the CRC from those bytes or from 0 (Header.crc0)
# magic, version, header_size, dim, n_layers, n_heads, n_kv_heads, hidden, vocab, max_seq, flags,
# tokenizer_id, norm_eps, rope_theta, body_len, crc32
HEADER_FMT = "<4sHHHHHHHHHHIffII"
HEADER_SIZE = struct.calcsize(HEADER_FMT)

FLAG_SHARED_CLS = 1  # the token embedding doubles as the classifier

KIND_Q8 = 0  # int8 matrix [rows, cols] + rows float32 scales
KIND_F32 = 1  # float32 vector


class ModelFileError(Exception):
    """A model file that cannot be used; the message says what is wrong, its reader what to do (the host: re-export
    the file, host/backends/modelio.py header_error; a board's: flash it again)."""


class Header:
    """Hyper-parameters of a model, as stored in the file header."""

    crc0 = 0  # where a reader starts the CRC of the body: parse_header's (version 2: the CRC of the header's bytes)

    def __init__(self, dim, n_layers, n_heads, n_kv_heads, hidden, vocab, max_seq,
                 flags=0, tokenizer_id=0, norm_eps=1e-5, rope_theta=10000.0, body_len=0, crc=0):
        self.dim = dim
        self.n_layers = n_layers
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.hidden = hidden
        self.vocab = vocab
        self.max_seq = max_seq
        self.flags = flags
        self.tokenizer_id = tokenizer_id
        self.norm_eps = norm_eps
        self.rope_theta = rope_theta
        self.body_len = body_len
        self.crc = crc

    @property
    def head_dim(self):
        return self.dim // self.n_heads

    @property
    def kv_dim(self):
        return self.n_kv_heads * (self.dim // self.n_heads)

    @property
    def norm_eps_bits(self):
        """The float32 bits of norm_eps (the integer arithmetic's input; exact on every runtime)."""
        return float32_bits(self.norm_eps)

    @property
    def rope_theta_bits(self):
        return float32_bits(self.rope_theta)

    def pack(self):
        return struct.pack(HEADER_FMT, MAGIC, VERSION, HEADER_SIZE, self.dim, self.n_layers,
                           self.n_heads, self.n_kv_heads, self.hidden, self.vocab, self.max_seq,
                           self.flags, self.tokenizer_id, self.norm_eps, self.rope_theta,
                           self.body_len, self.crc)

    def check(self):
        """Raise ModelFileError if the hyper-parameters cannot describe a model."""
        if min(self.dim, self.n_layers, self.n_heads, self.n_kv_heads, self.hidden,
               self.vocab, self.max_seq) <= 0:
            raise ModelFileError("model header has a zero dimension: the file is corrupt")
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads or self.head_dim % 2:
            raise ModelFileError("model header has inconsistent head counts: the file is corrupt")
        # the integer arithmetic's domain (docs/CONTRACTS.md section 4): eps as round(eps * 2^32) in an int32, theta's
        # log >= 0 for intmath's series (below 1 it never converged: a load that hung). A board checks the CRC as it
        # reads the body, after this (and a version 1 header is outside it), so a flipped bit lands here; NaN fails
        # both comparisons, and x * 0 is 0 only for a finite x
        if not 0 <= self.norm_eps < 0.5:
            raise ModelFileError("model header has norm_eps %r, outside 0..0.5: the file is corrupt"
                                 % (self.norm_eps,))
        if not (self.rope_theta >= 1 and self.rope_theta * 0 == 0):
            raise ModelFileError("model header has rope_theta %r, not a finite number >= 1: the file is corrupt"
                                 % (self.rope_theta,))
        if self.flags & ~FLAG_SHARED_CLS:
            raise ModelFileError("model header has flags 0x%x, which this build does not know: the file is corrupt "
                                 "or newer than this build" % self.flags)
        # a layer's wq and wo alone are dim * dim bytes each: n_layers past what body_len holds is refused before
        # body_size lists every layer (a flipped top bit of n_layers asked for 32,770 layers: a MemoryError on a board)
        if 2 * self.dim * self.dim * self.n_layers > self.body_len or self.body_len != body_size(self):
            raise ModelFileError("model header says %d tensor bytes, not its shape's: the file is corrupt"
                                 % self.body_len)


def float32_bits(v):
    """The IEEE-754 bits of v rounded to float32, as an unsigned int."""
    return struct.unpack("<I", struct.pack("<f", v))[0]


def parse_header(data):
    """Header from the first HEADER_SIZE bytes of a model file; raises ModelFileError. Its crc0 is the CRC-32 of
    the header's bytes before its crc field for a version 2 file, 0 for version 1 (None without binascii): the
    file's crc field is the CRC of the body continued from crc0 (`crc32(body, h.crc0)`)."""
    if len(data) < HEADER_SIZE:
        raise ModelFileError("model file is truncated (%d bytes, header needs %d)" % (len(data), HEADER_SIZE))
    f = struct.unpack(HEADER_FMT, bytes(data[:HEADER_SIZE]))
    if f[0] != MAGIC:
        raise ModelFileError("not a specmesh model file (bad magic %r)" % (f[0],))
    if not 0 < f[1] <= VERSION:
        raise ModelFileError("version %d is not supported (this build reads 1 to %d)" % (f[1], VERSION))
    if f[2] != HEADER_SIZE:
        raise ModelFileError("model header size %d, expected %d: the file is corrupt" % (f[2], HEADER_SIZE))
    h = Header(f[3], f[4], f[5], f[6], f[7], f[8], f[9], f[10], f[11], f[12], f[13], f[14], f[15])
    h.check()
    h.crc0 = crc32(data[:HEADER_SIZE - 4]) if f[1] > 1 else 0
    return h


def tensor_layout(h):
    """List of (name, kind, rows, cols) in file order; a KIND_F32 entry has rows == 1."""
    d, hd = h.dim, h.head_dim
    out = [("tok_emb", KIND_Q8, h.vocab, d)]
    for i in range(h.n_layers):
        p = "layers.%d." % i
        out.append((p + "attn_norm", KIND_F32, 1, d))
        out.append((p + "wq", KIND_Q8, h.n_heads * hd, d))
        out.append((p + "wk", KIND_Q8, h.n_kv_heads * hd, d))
        out.append((p + "wv", KIND_Q8, h.n_kv_heads * hd, d))
        out.append((p + "wo", KIND_Q8, d, h.n_heads * hd))
        out.append((p + "ffn_norm", KIND_F32, 1, d))
        out.append((p + "w1", KIND_Q8, h.hidden, d))
        out.append((p + "w2", KIND_Q8, d, h.hidden))
        out.append((p + "w3", KIND_Q8, h.hidden, d))
    out.append(("final_norm", KIND_F32, 1, d))
    if not h.flags & FLAG_SHARED_CLS:
        out.append(("cls", KIND_Q8, h.vocab, d))
    return out


def tensor_bytes(kind, rows, cols):
    """Bytes a tensor occupies in the file."""
    if kind == KIND_Q8:
        return rows * cols + 4 * rows
    return 4 * cols


def body_size(h):
    """Bytes of all tensors after the header."""
    n = 0
    for _name, kind, rows, cols in tensor_layout(h):
        n += tensor_bytes(kind, rows, cols)
    return n


def stage_bytes(h, a, b):
    """Bytes of the tensors a pipeline stage of layers a..b-1 loads: its layers, and the final norm when b
    is the last layer (the embedding and the classifier stay in the file: firmware/engine.py)."""
    n = 0
    layout = tensor_layout(h)
    for _name, kind, rows, cols in layout[1 + 9 * a:1 + 9 * b + (1 if b == h.n_layers else 0)]:
        n += tensor_bytes(kind, rows, cols)
    return n


def crc32(data, crc=0):
    """CRC-32 (zlib's), via binascii where the port has it; None where it does not."""
    try:
        import binascii
        return binascii.crc32(data, crc) & 0xFFFFFFFF
    except (ImportError, AttributeError):
        return None
