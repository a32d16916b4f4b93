"""Model files on the host: per-row int8 quantization, atomic write, validated read.

The layout (docs/CONTRACTS.md section 3) and the header live in `shared/modelfile.py`; this module
turns float or pre-quantized tensors into that file and back. An int8 matrix is a `QTensor`
(`q` int8 `[rows, cols]`, `s` float32 `[rows]`, `w ~= q * s[:, None]`); a vector is a float32 array.
A file's `crc` is the CRC-32 (zlib) of the header's bytes before it, then of the bytes after the header (version
2, which writers write); a version 1 file's covers the bytes after the header only (shared/modelfile.py VERSION).
"""

from __future__ import annotations

import copy
import math
import os
import struct
import zlib
from numbers import Integral
from pathlib import Path
from typing import NamedTuple

import numpy as np

from specmesh.host import atomic
from specmesh.shared.modelfile import (FLAG_SHARED_CLS, HEADER_SIZE, KIND_Q8, MAGIC, Header, ModelFileError, body_size,
                                       parse_header, tensor_layout)

MAX_FIELD, MAX_BODY = 0xFFFF, 0xFFFFFFFF  # the header's 16-bit sizes and 32-bit body length (HEADER_FMT)
SIZES = ("dim", "n_layers", "n_heads", "n_kv_heads", "hidden", "vocab", "max_seq")


class QTensor(NamedTuple):
    """A per-row quantized matrix: `q` int8 [rows, cols], `s` float32 [rows]."""

    q: np.ndarray
    s: np.ndarray

    def dequant(self) -> np.ndarray:
        return self.q.astype(np.float32) * self.s[:, None]


def quantize_rows(w: np.ndarray) -> QTensor:
    """Per-row int8: scale = max|row| / 127, q = round-half-away(w / scale) clipped to [-127, 127]."""
    w = np.asarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError("quantize_rows needs a 2-D matrix, got shape %s" % (w.shape,))
    s = (np.abs(w).max(axis=1) / np.float32(127.0)).astype(np.float32)
    safe = np.where(s > 0, s, np.float32(1.0))
    r = w / safe[:, None]
    q = np.clip(np.sign(r) * np.floor(np.abs(r) + np.float32(0.5)), -127, 127).astype(np.int8)
    return QTensor(q, s)


def _as_tensor(name: str, kind: int, rows: int, cols: int, value) -> bytes:
    if kind == KIND_Q8:
        qt = value if isinstance(value, QTensor) else (
            QTensor(*value) if isinstance(value, tuple) else quantize_rows(value))
        q = np.asarray(qt.q)
        s = np.asarray(qt.s, dtype=np.float32)
        if q.dtype != np.int8:
            raise ValueError("tensor %s: quantized values must be int8, got %s" % (name, q.dtype))
        if q.shape != (rows, cols) or s.shape != (rows,):
            raise ValueError("tensor %s: shape %s/%s, expected (%d, %d)/(%d,)"
                             % (name, q.shape, s.shape, rows, cols, rows))
        return q.tobytes() + s.astype("<f4").tobytes()
    v = np.asarray(value, dtype=np.float32).reshape(-1)
    if v.shape != (cols,):
        raise ValueError("tensor %s: shape %s, expected (%d,)" % (name, v.shape, cols))
    return v.astype("<f4").tobytes()


def pack_model(h: Header, body: bytes) -> bytes:
    """The bytes of a model file (this build's VERSION) of header `h` and tensor bytes `body`; sets h.body_len
    and h.crc."""
    h.body_len = len(body)
    h.crc = _crc(h.pack() + body)
    return h.pack() + body


def as_version_1(data: bytes) -> bytes:
    """A version 2 model file's bytes as the version 1 file of the same model (its crc the body's only, the header
    outside it): what files exported, and boards flashed, before version 2 hold."""
    out = bytearray(data)
    struct.pack_into("<H", out, 4, 1)
    struct.pack_into("<I", out, HEADER_SIZE - 4, zlib.crc32(memoryview(data)[HEADER_SIZE:]) & 0xFFFFFFFF)
    return bytes(out)


def _crc(data: bytes) -> int:
    """The crc a version 2 file `data` holds: of its header's bytes before that field, then of its body."""
    return zlib.crc32(memoryview(data)[HEADER_SIZE:], zlib.crc32(data[:HEADER_SIZE - 4])) & 0xFFFFFFFF


def _config_error(h: Header) -> str | None:
    """What of the model configuration `h` a model file cannot hold, the field named with what to choose; None when
    it holds it all. Header.check refuses the same headers as a corrupt file's (its reader's, a board's too: nothing
    on a board chose them); a writer's is a configuration to change, said here before anything is written."""
    for name in SIZES:
        v = getattr(h, name)
        if not isinstance(v, Integral):
            return "%s %r is not a whole number: choose a whole %s" % (name, v, name)
        if not 1 <= v <= MAX_FIELD:
            return "%s %d is outside 1..%d, the sizes a model file holds: choose %s in 1..%d" % (name, v, MAX_FIELD,
                                                                                              name, MAX_FIELD)
    if h.dim % h.n_heads:
        return "dim %d is not a multiple of n_heads %d: choose dim a multiple of n_heads" % (h.dim, h.n_heads)
    if h.head_dim % 2:
        return ("dim %d over n_heads %d is a head of %d, odd (RoPE turns pairs): choose dim and n_heads whose heads are "
                "even" % (h.dim, h.n_heads, h.head_dim))
    if h.n_heads % h.n_kv_heads:
        return ("n_heads %d is not a multiple of n_kv_heads %d: choose n_kv_heads dividing n_heads"
                % (h.n_heads, h.n_kv_heads))
    if not 0 <= h.norm_eps < 0.5:  # (NaN fails it) the integer arithmetic's domain, as Header.check says
        return "norm_eps %r is outside 0..0.5: choose norm_eps below 0.5 (1e-5 is usual)" % (h.norm_eps,)
    if not (h.rope_theta >= 1 and math.isfinite(h.rope_theta)):
        return "rope_theta %r is not a finite number >= 1: choose rope_theta >= 1 (10000 is usual)" % (h.rope_theta,)
    if h.flags & ~FLAG_SHARED_CLS:
        return "flags 0x%x has bits no model file knows: choose flags 0, or FLAG_SHARED_CLS (1)" % h.flags
    if not (isinstance(h.tokenizer_id, Integral) and 0 <= h.tokenizer_id <= MAX_BODY):
        return ("tokenizer_id %r is not a CRC-32 (0..%d): give the vocab table's (host/decode/tokenizer.py vocab_id), "
                "or 0" % (h.tokenizer_id, MAX_BODY))
    if body_size(h) > MAX_BODY:
        return ("tensors take %d bytes, over the %d a model file holds: choose a smaller dim, hidden, n_layers or "
                "vocab" % (body_size(h), MAX_BODY))
    return None


def check_config(path: str | os.PathLike, h: Header) -> None:
    """ValueError, naming the model file `path` and `_config_error`'s field, unless a model file holds `h`."""
    problem = _config_error(h)
    if problem is not None:
        raise ValueError("model %s cannot be written: its %s" % (path, problem))


def write_model(path: str | os.PathLike, header: Header, tensors: dict) -> Header:
    """Write a model file atomically; returns the header written (body_len and crc filled in).

    `tensors` maps every name of `tensor_layout(header)` to a float matrix (quantized here, per row),
    a `QTensor`/(q, s) tuple (written as is), or a float vector. Extra or missing names, or a configuration a model
    file cannot hold (`check_config`), raise ValueError.
    """
    check_config(path, header)
    h = copy.copy(header)
    layout = tensor_layout(h)
    names = {name for name, *_ in layout}
    missing, extra = names - tensors.keys(), tensors.keys() - names
    if missing or extra:
        raise ValueError("tensors do not match the header: missing %s, extra %s"
                         % (sorted(missing), sorted(extra)))
    data = pack_model(h, b"".join(_as_tensor(n, k, r, c, tensors[n]) for n, k, r, c in layout))
    h.check()  # what its readers check, past check_config's refusals: a header refused here is a bug of this writer
    atomic.write_bytes(path, data)
    return h


def check_model_file(path: str | os.PathLike) -> tuple[Header, bytes]:
    """Read a model file and check its header, its size and its CRC: (header, whole file bytes).

    Raises ModelFileError naming the file and saying what is wrong and what to do (bad magic, wrong
    version, inconsistent header, truncated, trailing bytes, bad CRC); OSError if it cannot be read.
    """
    data = Path(path).read_bytes()
    if len(data) < HEADER_SIZE:  # said as a body cut short is, with what to do (parse_header's line is a board's too)
        raise ModelFileError("model file %s is truncated (%d bytes, short of its %d-byte header): copy it again"
                             % (path, len(data), HEADER_SIZE))
    if data[:len(MAGIC)] != MAGIC:  # a saved web page, a git-lfs pointer, another format: parse_header said no fix
        raise ModelFileError("model file %s is not a specmesh model file (bad magic %r): copy it again, or convert the "
                             "model (models/MODEL_CARD.md: python -m specmesh.tools.llama2c_import)"
                             % (path, data[:len(MAGIC)]))
    try:
        h = parse_header(data)
    except ModelFileError as e:
        # a version 2 header is inside the CRC: a flipped bit that made a field impossible is said as one in the body
        version, crc = struct.unpack_from("<H", data, 4)[0], struct.unpack_from("<I", data, HEADER_SIZE - 4)[0]
        if version == 2 and _crc(data) != crc:
            raise _corrupt(path) from None
        raise header_error(path, e) from None
    have = len(data) - HEADER_SIZE
    if have < h.body_len:
        raise ModelFileError("model file %s is truncated (%d of %d tensor bytes): copy it again"
                             % (path, have, h.body_len))
    if have > h.body_len:
        raise ModelFileError("model file %s has %d unexpected trailing bytes: the file is corrupt, copy or export it "
                             "again" % (path, have - h.body_len))
    if zlib.crc32(memoryview(data)[HEADER_SIZE:], h.crc0) & 0xFFFFFFFF != h.crc:
        raise _corrupt(path)
    return h, data


def header_error(path: str | os.PathLike, e: ModelFileError) -> ModelFileError:
    """parse_header's error `e` of the model file `path`, with the file named and what to do (the header's own line
    says neither: a board's is told to flash it again)."""
    return ModelFileError("model file %s: %s, re-export it" % (path, e))


def _corrupt(path: str | os.PathLike) -> ModelFileError:
    return ModelFileError("model file %s fails its CRC check: the file is corrupt, copy or export it again" % (path,))


def read_model(path: str | os.PathLike) -> tuple[Header, dict]:
    """Read and validate a model file (`check_model_file`): (header, {name: QTensor or float32 vector})."""
    h, data = check_model_file(path)
    body = memoryview(data)[HEADER_SIZE:]
    out: dict = {}
    off = 0
    for name, kind, rows, cols in tensor_layout(h):
        if kind == KIND_Q8:
            q = np.frombuffer(body, dtype=np.int8, count=rows * cols, offset=off).reshape(rows, cols)
            off += rows * cols
            s = np.frombuffer(body, dtype="<f4", count=rows, offset=off).astype(np.float32)
            off += 4 * rows
            out[name] = QTensor(q.copy(), s)
        else:
            out[name] = np.frombuffer(body, dtype="<f4", count=cols, offset=off).astype(np.float32)
            off += 4 * cols
    assert off == body_size(h)
    return h, out
