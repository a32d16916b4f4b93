"""What one forward pass of the firmware engine costs on a board, term by term.

`pass_work(h, k, ctx, layers, classifier)` counts, from the shapes alone, the Xtensa instructions each
step of firmware/engine.py executes for a pass over k positions ending at context length ctx: the loop
sizes of its viper kernels (host/hardware.XTENSA_LOOPS, counted by tools/xtensa_loops.py) times their
trip counts, plus the calls from engine.py into the kernels and the bytes streamed from PSRAM.
`Rates` turns that into seconds: derived from host/projection/hardware.py, or measured on a board
(host/projection/calibration.py). The terms:

| term | what | unit |
| --- | --- | --- |
| matmul | the int8 weight matmuls, by positions per pass over a row (1, 2-3, 4-5) | insn |
| requant | quant of matmul inputs to int16, requant of outputs, quant of the new KV rows | insn |
| residual | the requant of wo and w2, which adds into the residual stream | insn |
| rmsnorm, rope, silu | those kernels | insn |
| softmax | attend's per-score work (scaling, exp, the max, the weights) and per-head set-up | insn |
| kv_reads | attend's q.k and p.v over the int8 cache, per cached value | insn |
| embed_argmax | the token embedding (first layer) and the greedy argmax (classifier) | insn |
| engine | kernel calls from engine.py (interpreted Python between kernels) | call |
| weights_psram | weight bytes of a model over SRAM_BUDGET, once per pass | byte |
| kv_psram | KV-cache bytes read once per layer when the model lives in PSRAM | byte |
| weights_flash | weight bytes of a model on a ROMFS (memory-mapped flash), once per pass | byte |

Where a board keeps a model (host/boardclasses.py `on_romfs`): a board with PSRAM in its PSRAM heap; a board without PSRAM in
its heap when the engine fits there beside the node's reserve (no flash read per pass), else in its
ROMFS (`specmesh flash` decides the same way: the heap keeps the engine's buffers and KV cache only, and
the weights stream from flash every pass); a pipeline stage's slice sits in the heap.
"""

from __future__ import annotations

from specmesh.host.projection.hardware import (NATIVE_COUNTED, NATIVE_XTENSA, RUNTIME_CALL, SHIFT_STEPS,
                                               XTENSA_LOOP_CALLS, XTENSA_LOOPS)
from specmesh.shared.modelfile import FLAG_SHARED_CLS, Header, tensor_bytes, tensor_layout

SRAM_BUDGET = 256 * 1024  # model bytes an ESP32-S3 keeps in internal SRAM; larger ones live in PSRAM
COMPUTE = ("matmul_1", "matmul_5", "requant", "residual", "rmsnorm", "rope", "softmax", "kv_reads", "silu",
           "embed_argmax")
TERMS = COMPUTE + ("engine", "weights_psram", "kv_psram", "weights_flash")


def layer_span(h: Header, layers: tuple[int, int] | None) -> tuple[int, int]:
    """(a, b) of `layers` checked against the model, or every layer when None."""
    a, b = (0, h.n_layers) if layers is None else layers
    if not 0 <= a <= b <= h.n_layers:
        raise ValueError("layers %r outside the model's %d layers" % (layers, h.n_layers))
    return a, b


def weight_bytes(h: Header, layers: tuple[int, int] | None = None, classifier: bool = True) -> int:
    """Bytes of the tensors a pass over layers a..b-1 (and the classifier, with its final norm) reads:
    what a board running that slice holds. The token embedding is counted with the first layer."""
    a, b = layer_span(h, layers)
    n = 0
    for name, kind, rows, cols in tensor_layout(h):
        if name.startswith("layers."):
            use = a <= int(name.split(".")[1]) < b
        elif name == "tok_emb":
            use = a == 0 and b > 0 or classifier and bool(h.flags & FLAG_SHARED_CLS)
        else:  # final_norm, cls
            use = classifier
        n += tensor_bytes(kind, rows, cols) if use else 0
    return n


def loop_insns(kernel: str, i: int) -> float:
    """Instructions of loop i of a viper kernel, its runtime calls included."""
    calls = XTENSA_LOOP_CALLS.get(kernel, [0] * len(XTENSA_LOOPS[kernel]))[i]
    return XTENSA_LOOPS[kernel][i] + calls * RUNTIME_CALL.value


def _groups(k: int) -> list[int]:
    """Positions per pass over a weight row: matmul takes them 5 at a time, the rest in one group."""
    return [5] * (k // 5) + ([k % 5] if k % 5 else [])


class Work(dict):
    """{term: amount} of one or more passes (instructions, kernel calls or bytes; see the module doc)."""

    def add(self, term: str, amount: float) -> None:
        self[term] = self.get(term, 0.0) + amount


class Viper:
    """The viper kernels of firmware/kernels.py: each loop's counted instructions times its trip count."""

    name = "viper"
    source = "counted (tools/xtensa_loops.py, mpy-cross -march=xtensawin)"
    calls_per_layer = 26  # engine._layer calls each kernel on its own

    def matmul(self, w: Work, rows: int, cols: int, k: int) -> None:
        """A rows x cols matmul over k positions (kernels.matmul's loops: row, group, then per column)."""
        own_row, own_group, one, five, some = (loop_insns("matmul", i) for i in range(5))
        for g in _groups(k):
            per_col = one if g == 1 else five if g >= 4 else some
            w.add("matmul_1" if g == 1 else "matmul_5", rows * (cols * per_col + own_group))
        w.add("matmul_1" if k == 1 else "matmul_5", rows * own_row)

    def quant(self, w: Work, rows: int, n: int, term: str = "requant") -> None:
        """kernels.quant of `rows` rows of n values: per row, its largest |x|, its shift, its values."""
        w.add(term, rows * (loop_insns("quant", 0) + n * (loop_insns("quant", 1) + loop_insns("quant", 3))
                            + SHIFT_STEPS.value * loop_insns("quant", 2)))

    def requant(self, w: Work, n: int, k: int, term: str = "requant") -> None:
        w.add(term, k * (loop_insns("requant", 0) + n * loop_insns("requant", 1)))

    def rmsnorm(self, w: Work, dim: int, k: int) -> None:
        """Per row: set-up with two divisions, the shift loop, ~8 normalising steps, ~8 Newton steps."""
        shift, normalise = loop_insns("rmsnorm", 2), loop_insns("rmsnorm", 5)  # loop 4 zeroes a null row: rare
        per_row = loop_insns("rmsnorm", 0) + SHIFT_STEPS.value * (shift + normalise) + 8 * loop_insns("rmsnorm", 6)
        per_value = loop_insns("rmsnorm", 1) + loop_insns("rmsnorm", 3) + loop_insns("rmsnorm", 7)
        w.add("rmsnorm", k * (per_row + dim * per_value))

    def rope(self, w: Work, h: Header, heads: int, k: int) -> None:
        half = h.head_dim // 2
        w.add("rope", k * (loop_insns("rope", 0) + half * (loop_insns("rope", 1) + heads * loop_insns("rope", 2))))

    def attend(self, w: Work, h: Header, k: int, ctx: int) -> None:
        """Query j (of k, the last at ctx) attends over ctx - k + j + 1 cached positions in every head."""
        hd = h.head_dim
        per_head = (loop_insns("attend", 0) + SHIFT_STEPS.value * loop_insns("attend", 2)
                    + hd * (loop_insns("attend", 1) + loop_insns("attend", 3) + loop_insns("attend", 7)
                            + loop_insns("attend", 10)))
        per_score = loop_insns("attend", 4) + loop_insns("attend", 6) + loop_insns("attend", 8)
        per_value = loop_insns("attend", 5) + loop_insns("attend", 9)  # q.k and p.v, per cached value
        scores = _scores(h, k, ctx)
        w.add("softmax", k * h.n_heads * per_head + scores * per_score)
        w.add("kv_reads", scores * hd * per_value)

    def silu(self, w: Work, hidden: int, k: int) -> None:
        per_row = loop_insns("silu", 0) + SHIFT_STEPS.value * loop_insns("silu", 2)
        w.add("silu", k * (per_row + hidden * (loop_insns("silu", 1) + loop_insns("silu", 3))))

    def embed(self, w: Work, values: int) -> None:
        w.add("embed_argmax", values * loop_insns("embed", 0))

    def argmax(self, w: Work, values: int) -> None:
        w.add("embed_argmax", values * loop_insns("argmax", 0))


class Native:
    """The native kernels (firmware/native/, issue 21), per unit of work: host/projection/hardware.py NATIVE_XTENSA,
    whose NATIVE_COUNTED says where the figures come from (executed by the xtensawin module on an Xtensa core)."""

    name = "native"
    calls_per_layer = 1  # the module's `layer` kernel runs engine._layer's steps in one call

    def __init__(self, counts: dict | None = None, source: str | None = None):
        self.n = dict(NATIVE_XTENSA if counts is None else counts)
        self.source = source or (NATIVE_COUNTED if counts is None else "given")

    def matmul(self, w: Work, rows: int, cols: int, k: int) -> None:
        per_mac, per_row = self.n["matmul_per_mac"], self.n["matmul_per_row"]
        for g in _groups(k):
            row = per_row[g] if isinstance(per_row, dict) else per_row
            w.add("matmul_1" if g == 1 else "matmul_5", rows * (cols * g * per_mac[g] + row))

    def quant(self, w: Work, rows: int, n: int, term: str = "requant") -> None:
        w.add(term, rows * (self.n["quant_per_row"] + n * self.n["quant_per_value"]))

    def requant(self, w: Work, n: int, k: int, term: str = "requant") -> None:
        w.add(term, k * n * self.n["requant_per_value"])

    def rmsnorm(self, w: Work, dim: int, k: int) -> None:
        w.add("rmsnorm", k * (self.n["rmsnorm_per_row"] + dim * self.n["rmsnorm_per_value"]))

    def rope(self, w: Work, h: Header, heads: int, k: int) -> None:
        w.add("rope", k * heads * (h.head_dim // 2) * self.n["rope_per_pair"])

    def attend(self, w: Work, h: Header, k: int, ctx: int) -> None:
        scores = _scores(h, k, ctx)
        w.add("softmax", k * h.n_heads * self.n["softmax_per_head"] + scores * self.n["softmax_per_score"])
        kv = self.n["kv_per_value_hd8"] if h.head_dim == 8 and "kv_per_value_hd8" in self.n else self.n["kv_per_value"]
        w.add("kv_reads", scores * h.head_dim * 2 * kv)

    def silu(self, w: Work, hidden: int, k: int) -> None:
        w.add("silu", k * hidden * self.n["silu_per_value"])

    def embed(self, w: Work, values: int) -> None:
        w.add("embed_argmax", values * self.n["embed_per_value"])

    def argmax(self, w: Work, values: int) -> None:
        w.add("embed_argmax", values * self.n["argmax_per_value"])


def _scores(h: Header, k: int, ctx: int) -> int:
    """Attention scores of a pass: query j (of k, the last at ctx) over ctx - k + j + 1 cached positions,
    in every head."""
    return sum(ctx - k + j + 1 for j in range(k)) * h.n_heads


VIPER = Viper()
NATIVE = Native()
KERNELS: dict[str, Viper | Native] = {VIPER.name: VIPER, NATIVE.name: NATIVE}


def pass_work(h: Header, k: int, ctx: int, layers: tuple[int, int] | None = None,
              classifier: bool = True, on_romfs: bool = False, kernels: Viper | Native = VIPER) -> Work:
    """The work of one engine.forward over k positions ending at context length ctx, restricted to
    layers a..b-1 (and the classifier when `classifier`), as firmware/engine.py does it with `kernels`;
    `on_romfs`: the weights stay in memory-mapped flash (the KV cache in the heap)."""
    a, b = layer_span(h, layers)
    K = kernels
    d, qd, kvd, hid = h.dim, h.n_heads * h.head_dim, h.kv_dim, h.hidden
    w = Work()
    if a == 0 and b > 0:
        K.embed(w, k * d)
        w.add("engine", k)
    for _ in range(a, b):
        K.rmsnorm(w, d, k)
        K.quant(w, k, d)
        for rows in (qd, kvd, kvd):
            K.matmul(w, rows, d, k)
            K.requant(w, rows, k)
        K.rope(w, h, h.n_heads, k)
        K.rope(w, h, h.n_kv_heads, k)
        K.quant(w, 2 * k, kvd)  # the new key and value rows into the cache
        K.attend(w, h, k, ctx)
        K.quant(w, k, qd)
        K.matmul(w, d, qd, k)
        K.requant(w, d, k, "residual")
        K.rmsnorm(w, d, k)
        K.quant(w, k, d)
        for _ in range(2):
            K.matmul(w, hid, d, k)
            K.requant(w, hid, k)
        K.silu(w, hid, k)
        K.quant(w, k, hid)
        K.matmul(w, d, hid, k)
        K.requant(w, d, k, "residual")
        w.add("engine", K.calls_per_layer)  # kernel calls of engine._layer
        w.add("kv_psram", 2 * (kvd + 1) * ctx)  # each cached key and value row once (the data cache
        # keeps a layer's rows for the pass's other queries and heads)
    if classifier:
        block = max(d, qd, hid)
        blocks = -(-h.vocab // block)
        K.rmsnorm(w, d, k)
        K.quant(w, k, d)
        for r0 in range(0, h.vocab, block):
            n = min(block, h.vocab - r0)
            K.matmul(w, n, d, k)
            K.requant(w, n, k)
        K.argmax(w, k * h.vocab)
        w.add("engine", 2 + 2 * blocks + k)  # rmsnorm, quant, (matmul, requant) per block, argmax per row
    size = weight_bytes(h, layers, classifier)
    if on_romfs:
        w.add("weights_flash", size)
        w.pop("kv_psram", None)
    elif size > SRAM_BUDGET:  # the board holds this slice in PSRAM, its KV cache too
        w.add("weights_psram", size)
    else:
        w.pop("kv_psram", None)
    return w
