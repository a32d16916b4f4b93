"""Convert a llama2.c checkpoint (+ its tokenizer.bin) into a specmesh model file (+ vocab table).

Reads llama2.c's three layouts (model.py / export.py):
  - version 0 (legacy): 7 int32 (dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len; a negative
    vocab means a separate classifier), then float32 tensors in run.c's order, RoPE tables skipped;
  - version 1 ("ak42", fp32) and version 2 ("ak42", Q8_0 int8 in groups): a 256-byte header (magic,
    version, 7 int32, u8 shared classifier, i32 group size), the norms in float32, then the matrices
    (version 2: all matrices' int8 values, then all their float32 group scales).
Matrices are re-quantized per row (a version-2 file is dequantized group by group first).

    python -m specmesh.tools.llama2c_import stories260K.bin --tokenizer tok512.bin --out models/stories260K.spm
"""

from __future__ import annotations

import argparse
import struct
import sys
from pathlib import Path

import numpy as np

from specmesh.tools import run_tool, said
from specmesh.host import atomic
from specmesh.host.cli.flags import a_path
from specmesh.host.backends.modelio import MAX_BODY, MAX_FIELD, write_model
from specmesh.host.decode.tokenizer import TokenizerError, byte_pieces, pack_vocab, read_llama2c_tokenizer, vocab_id
from specmesh.shared.modelfile import FLAG_SHARED_CLS, Header, ModelFileError, body_size

AK42 = 0x616B3432
MATS = ("wq", "wk", "wv", "wo", "w1", "w2", "w3")


class ImportError_(Exception):
    """The checkpoint cannot be converted; the message says why."""


class _Reader:
    def __init__(self, data: bytes, off: int):
        self.data, self.off = data, off

    def take(self, dtype, n: int) -> np.ndarray:
        size = np.dtype(dtype).itemsize * n
        if self.off + size > len(self.data):
            raise ImportError_("checkpoint is truncated (needs more than its %d bytes)" % len(self.data))
        a = np.frombuffer(self.data, dtype=dtype, count=n, offset=self.off)
        self.off += size
        return a


def _shapes(dim, hidden, n_heads, n_kv):
    hd = dim // n_heads
    return {"wq": (n_heads * hd, dim), "wk": (n_kv * hd, dim), "wv": (n_kv * hd, dim),
            "wo": (dim, n_heads * hd), "w1": (hidden, dim), "w2": (dim, hidden), "w3": (hidden, dim)}


def read_checkpoint(data: bytes) -> tuple[dict, dict[str, np.ndarray]]:
    """(config, float32 tensors under specmesh names) of a llama2.c checkpoint's bytes."""
    if len(data) < 28:
        raise ImportError_("file too small to be a llama2.c checkpoint")
    magic, version = struct.unpack_from("<Ii", data, 0)
    if magic == AK42:
        if version not in (1, 2):
            raise ImportError_("llama2.c checkpoint version %d is not supported (0, 1 and 2 are)" % version)
        dim, hidden, L, nh, nkv, vocab, seq = struct.unpack_from("<7i", data, 8)
        shared = bool(data[36])
        group = struct.unpack_from("<i", data, 37)[0]
        r = _Reader(data, 256)
    else:
        version = 0
        dim, hidden, L, nh, nkv, vocab, seq = struct.unpack_from("<7i", data, 0)
        shared = vocab > 0
        vocab = abs(vocab)
        group = 0
        r = _Reader(data, 28)
    cfg = {"dim": dim, "hidden": hidden, "n_layers": L, "n_heads": nh, "n_kv_heads": nkv, "vocab": vocab,
           "max_seq": seq, "shared_cls": shared, "version": version}
    if min(dim, hidden, L, nh, nkv, vocab, seq) <= 0 or dim % nh or nh % nkv or (dim // nh) % 2:
        raise ImportError_("implausible llama2.c header %s: not a llama2.c checkpoint?" % (cfg,))
    _fits(cfg)
    shapes = _shapes(dim, hidden, nh, nkv)
    t: dict[str, np.ndarray] = {}

    def f32(rows, cols):
        return r.take("<f4", rows * cols).reshape(rows, cols).astype(np.float32)

    if version == 0:
        t["tok_emb"] = f32(vocab, dim)
        att = r.take("<f4", L * dim).reshape(L, dim)
        per = {n: [f32(*shapes[n]) for _ in range(L)] for n in ("wq", "wk", "wv", "wo")}
        ffn = r.take("<f4", L * dim).reshape(L, dim)
        per.update({n: [f32(*shapes[n]) for _ in range(L)] for n in ("w1", "w2", "w3")})
        final = r.take("<f4", dim)
        r.take("<f4", seq * (dim // nh))  # freq_cis_real + freq_cis_imag, unused
        if not shared:
            t["cls"] = f32(vocab, dim)
    else:
        att = r.take("<f4", L * dim).reshape(L, dim)
        ffn = r.take("<f4", L * dim).reshape(L, dim)
        final = r.take("<f4", dim)
        order = [(vocab, dim)] + [shapes[n] for n in MATS for _ in range(L)] + ([] if shared else [(vocab, dim)])
        if version == 1:
            mats = [f32(rows, cols) for rows, cols in order]
        else:  # every matrix's int8 values, then every matrix's group scales
            if group <= 0 or any((rows * cols) % group for rows, cols in order):
                raise ImportError_("group size %d does not divide the matrices" % group)
            qs = [r.take(np.int8, rows * cols) for rows, cols in order]
            mats = [(q.astype(np.float32).reshape(-1, group) * r.take("<f4", len(q) // group)[:, None]
                     ).reshape(rows, cols) for q, (rows, cols) in zip(qs, order)]
        t["tok_emb"] = mats[0]
        per = {n: mats[1 + j * L:1 + (j + 1) * L] for j, n in enumerate(MATS)}
        if not shared:
            t["cls"] = mats[-1]
    if r.off != len(data):
        raise ImportError_("checkpoint has %d bytes left over: the header does not match the weights"
                           % (len(data) - r.off))
    for i in range(L):
        p = "layers.%d." % i
        t[p + "attn_norm"] = att[i].astype(np.float32)
        t[p + "ffn_norm"] = ffn[i].astype(np.float32)
        for n in MATS:
            t[p + n] = per[n][i]
    t["final_norm"] = final.astype(np.float32)
    return cfg, t


def _header(cfg: dict, tokenizer_id: int = 0) -> Header:
    """The specmesh model header of a checkpoint's config (body_len and crc left for write_model)."""
    return Header(cfg["dim"], cfg["n_layers"], cfg["n_heads"], cfg["n_kv_heads"], cfg["hidden"], cfg["vocab"],
                  cfg["max_seq"], flags=FLAG_SHARED_CLS if cfg["shared_cls"] else 0, tokenizer_id=tokenizer_id,
                  norm_eps=1e-5, rope_theta=10000.0)


def _fits(cfg: dict) -> None:
    """ImportError_ unless the model file's header can hold the checkpoint's sizes: said before its weights are
    read, not as struct's error when the header is packed (after minutes of quantizing a large model)."""
    big = {k: v for k, v in cfg.items() if k not in ("shared_cls", "version") and v > MAX_FIELD}
    if big:
        raise ImportError_("a specmesh model file holds sizes up to %d, this checkpoint has %s"
                           % (MAX_FIELD, ", ".join("%s %d" % kv for kv in big.items())))
    if body_size(_header(cfg)) > MAX_BODY:
        raise ImportError_("a specmesh model file holds up to 4 GiB of int8 tensors, this checkpoint needs %d bytes"
                           % body_size(_header(cfg)))


def convert(checkpoint: Path, tokenizer: Path | None, out: Path, vocab_out: Path | None) -> Header:
    """Write the specmesh model (and vocab table if a tokenizer is given); returns the header. Everything that can
    fail is read and checked before either file is written, and the model (the long write) goes first, so a
    failure or a Ctrl-C leaves no vocab table beside a model that was never written."""
    cfg, tensors = read_checkpoint(checkpoint.read_bytes())
    table = None
    if tokenizer is not None:
        pieces, _scores = read_llama2c_tokenizer(tokenizer, cfg["vocab"])
        table = pack_vocab(byte_pieces(pieces))
    h = write_model(out, _header(cfg, vocab_id(table) if table is not None else 0), tensors)
    if table is not None:
        atomic.write_bytes(vocab_out or out.with_suffix(".vocab.bin"), table)
    return h


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specmesh.tools.llama2c_import", description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint", type=a_path, help="llama2.c .bin (version 0, 1 or 2)")
    ap.add_argument("--tokenizer", type=a_path, help="llama2.c tokenizer.bin for this model")
    ap.add_argument("--out", type=a_path, required=True, help="specmesh model file to write")
    ap.add_argument("--vocab-out", type=a_path, help="vocab table (default: <out>.vocab.bin)")
    a = ap.parse_args(argv)
    outs = [a.out] + ([a.vocab_out or a.out.with_suffix(".vocab.bin")] if a.tokenizer else [])
    reads = [("the checkpoint", a.checkpoint)] + ([("--tokenizer", a.tokenizer)] if a.tokenizer else [])
    for i, (flag, out) in enumerate(zip(("--out", "--vocab-out"), outs)):  # a typo replacing an input, or the model
        same = [name for name, p in reads + [("--out", a.out)][:i] if p.resolve() == out.resolve()]
        if same:
            print("llama2c_import: %s %s is %s: give it another name" % (flag, out, same[0]), file=sys.stderr)
            return 1
    for out in outs:  # said of the path given, not of the temporary file beside it that the write would fail on
        problem = atomic.unwritable(out)
        if problem:
            print("llama2c_import: %s cannot be written: %s" % (out, problem), file=sys.stderr)
            return 1
    try:
        h = convert(a.checkpoint, a.tokenizer, a.out, a.vocab_out)
    except ImportError_ as e:  # its message names no file
        print("llama2c_import: %s: %s" % (a.checkpoint, e), file=sys.stderr)
        return 1
    except (TokenizerError, ModelFileError, OSError, ValueError) as e:
        print("llama2c_import: %s" % said(e), file=sys.stderr)
        return 1
    print("llama2c_import: %s: dim %d, %d layers, vocab %d, %d bytes"
          % (a.out, h.dim, h.n_layers, h.vocab, a.out.stat().st_size))
    return 0


if __name__ == "__main__":
    run_tool("llama2c_import", main)
