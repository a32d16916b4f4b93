"""Random model files with the specmesh layout, for tests and benchmarks when no trained model is at hand."""

from __future__ import annotations

import os

import numpy as np

from specmesh.host.backends.modelio import pack_model, write_model
from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.shared.modelfile import HEADER_SIZE, KIND_Q8, Header, parse_header, tensor_layout


def random_tensors(h: Header, seed: int = 0) -> dict:
    """Float tensors for every name of `tensor_layout(h)`: N(0, 1/cols) matrices, norms near 1."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, kind, rows, cols in tensor_layout(h):
        if kind == KIND_Q8:
            std = 1.0 if name == "tok_emb" else cols ** -0.5
            out[name] = rng.normal(0.0, std, size=(rows, cols)).astype(np.float32)
        else:
            out[name] = rng.uniform(0.7, 1.3, size=cols).astype(np.float32)
    return out


def random_model(path: str | os.PathLike, dim: int = 32, n_layers: int = 2, n_heads: int = 4,
                 n_kv_heads: int = 2, hidden: int = 64, vocab: int = 96, max_seq: int = 64,
                 flags: int = 0, seed: int = 0) -> Header:
    """Write a random model file at `path`; returns its header."""
    h = Header(dim, n_layers, n_heads, n_kv_heads, hidden, vocab, max_seq, flags=flags)
    return write_model(path, h, random_tensors(h, seed))


def random_pair(folder: str | os.PathLike, vocab: int = 64, max_seq: int = 96, seed: int = 31) -> None:
    """A small random target.spm (dim 32, 2 layers) and drafter.spm (dim 16, 1 layer) in `folder`."""
    random_model(os.path.join(folder, TARGET_FILE), dim=32, n_layers=2, hidden=64, vocab=vocab, max_seq=max_seq,
                 seed=seed)
    random_model(os.path.join(folder, DRAFTER_FILE), dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32,
                 vocab=vocab, max_seq=max_seq, seed=seed + 1)


def with_context(src: str | os.PathLike, dst: str | os.PathLike, max_seq: int) -> Header:
    """Copy the model file `src` to `dst` with a context of `max_seq` positions (the same weights: the tensor
    layout does not depend on it; its crc made anew); returns its header."""
    data = open(src, "rb").read()
    h = parse_header(data)
    h.max_seq = max_seq
    with open(dst, "wb") as f:
        f.write(pack_model(h, data[HEADER_SIZE:]))
    return h


if __name__ == "__main__":
    from specmesh.tools import not_a_command

    not_a_command("testmodels", "random model files are made by the tests (make test); the shipped ones are in models/")
