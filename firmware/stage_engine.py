"""The engine of a pipeline stage: layers [a, b) of a model, its embedding and classifier left in the file.

    e = StageEngine(path, layers=(a, b), kmax=1, viper=True, n_ctx=0, native=True)
    e.forward(tokens, pos)            # the first stage (a == 0): token ids in; e.x holds its output rows
    e.forward(None, pos, k, head)     # a later stage: the k rows of e.x in (the previous stage's e.x)
                                      # the last stage (b == n_layers) returns the logits when head is true

firmware/engine.py's Engine loads only the layers' tensors (and the final norm on the last stage). The
token embedding is read from the file one row (dim int8) and its scale per token, so the first stage
holds no vocab x dim matrix; the last stage streams the classifier (the embedding when the model shares
it) from the file in chunks of CLS_ROWS rows through one preallocated buffer, each chunk applied to all
k positions: vocab x dim + 4 x vocab bytes read per pass instead of held (docs/pipeline.md weighs this).
Where the stage's heap allows (an ESP32-S3: not a classic ESP32, whose 110 KB hold its layer, cache and
tables with 31 KB to spare), `hold_classifier(reserve)` reads the classifier into the heap once, at load,
when that leaves the node's reserve free: the engine then runs it as the single-board engine does, the
same integers (tests/test_stage_engine.py), and reads nothing per pass (`cls_held`; the node says which in
HELLO, CAP_CLS_HELD; host/boardclasses.py stage_keeps_classifier is the projection's estimate of it).
The file stays open for the engine's life. Imported only by a stage (the other roles never pay for it).
"""

import gc

from engine import Engine, _read, _zeros
from shared import intmath
from shared.modelfile import FLAG_SHARED_CLS, HEADER_SIZE, body_size

CLS_ROWS = 16  # classifier rows streamed per chunk: 16 x dim bytes of buffer


class StageEngine(Engine):
    """Engine over layers a..b-1, reading embedding rows and classifier chunks from its open model file."""

    def __init__(self, path, layers, kmax=1, viper=True, n_ctx=0, native=True):
        if layers is None:
            raise ValueError("a stage needs \"layers\": [a, b] in its board config (flash --role stage --layers A:B)")
        Engine.__init__(self, path, kmax, viper, n_ctx, layers, native)
        h = self.header
        dim = h.dim
        self._f = open(path, "rb")
        self.emb_off = HEADER_SIZE
        self.cls_off = HEADER_SIZE if h.flags & FLAG_SHARED_CLS else HEADER_SIZE + body_size(h) - (
            h.vocab * dim + 4 * h.vocab)
        self.cls_held = False
        if self.head:  # a classifier chunk and its row scales
            self.cw, self.cms = bytearray(CLS_ROWS * dim), _zeros("i", CLS_ROWS)
        if self.a == 0:  # one embedding row and its scale
            self.ew, self.ems = bytearray(dim), _zeros("i", 1)

    def hold_classifier(self, reserve):
        """Read the classifier and its row scales into the heap, once, if that leaves `reserve` bytes free
        (else, or where the heap has no block for it, keep streaming it); returns whether it is held."""
        vocab, dim = self.vocab, self.header.dim
        n = vocab * dim
        gc.collect()
        if not self.head or self.cls_held or gc.mem_free() < n + 4 * vocab + reserve:
            return self.cls_held
        try:
            w, ms = bytearray(n), _zeros("i", vocab)
        except MemoryError:  # free bytes, but no block that large: stream as before
            gc.collect()
            return False
        f = self._f
        f.seek(self.cls_off)
        _read(f, w, n, None)
        _read(f, ms, 4 * vocab, None)
        for r in range(vocab):
            ms[r] = intmath.fixed_packed(ms[r])
        self.cls = (w, ms, vocab, dim)  # Engine.forward runs it as the whole model's classifier
        self.cw = self.cms = None
        self.cls_held = True
        gc.collect()
        return True

    def _embed_row(self, t):
        """Embed token t into self.x at the offset embed_p holds, from its row and scale read from the file."""
        f, dim = self._f, self.header.dim
        f.seek(self.emb_off + t * dim)
        _read(f, self.ew, dim, None)
        f.seek(self.emb_off + self.vocab * dim + 4 * t)
        _read(f, self.ems, 4, None)
        ems = self.ems
        ems[0] = intmath.fixed_packed(ems[0])
        self.embed_p[1] = 0  # the token's row is the one read
        self.kern.embed(self.x, self.ew, ems, self.embed_p)

    def _stream_cls(self, k):
        """self.logits = classifier @ self.xn for k rows, its rows read from the file CLS_ROWS at a time."""
        f, dim, vocab = self._f, self.header.dim, self.vocab
        self._quant_rows(self.xn, dim, k)
        cw, cms = self.cw, self.cms
        r0 = 0
        while r0 < vocab:
            n = min(CLS_ROWS, vocab - r0)
            f.seek(self.cls_off + r0 * dim)
            _read(f, memoryview(cw)[:n * dim], n * dim, None)
            f.seek(self.cls_off + vocab * dim + 4 * r0)
            _read(f, memoryview(cms)[:n], 4 * n, None)
            for r in range(n):
                cms[r] = intmath.fixed_packed(cms[r])
            self._block(cw, cms, n, dim, 0, self.logits, k, r0, vocab, 0)
            r0 += n
