"""Tokenizers at run time: specmesh's byte-level BPE (models/tokenizer.json), the board vocab table
(models/vocab.bin) and llama2.c's tokenizer.bin, all behind one encode/decode interface.

vocab.bin (little-endian), small enough for a board to `readinto` one buffer:
    magic b"SPMV", u16 version (1), u16 n_tokens, u16 offsets[n_tokens + 1], then the token bytes
    concatenated; token i is bytes[offsets[i]:offsets[i + 1]] (special tokens are empty).
The tokenizer id in a model header is `vocab_id(vocab.bin bytes)`: the CRC-32 of the whole table.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

VOCAB_MAGIC = b"SPMV"
VOCAB_VERSION = 1
BOS = 0  # "<s>": starts every document; the models treat it as end of text too


class TokenizerError(Exception):
    """A tokenizer file that cannot be used; the message says what is wrong."""


def pack_vocab(pieces: list[bytes]) -> bytes:
    """The vocab.bin bytes for a list of token byte strings."""
    offs, n = [0], 0
    for p in pieces:
        n += len(p)
        offs.append(n)
    if n > 0xFFFF:
        raise TokenizerError("vocab table too large for u16 offsets (%d bytes)" % n)
    return (VOCAB_MAGIC + struct.pack("<HH", VOCAB_VERSION, len(pieces))
            + struct.pack("<%dH" % len(offs), *offs) + b"".join(pieces))


def unpack_vocab(data: bytes) -> list[bytes]:
    """Token byte strings from vocab.bin bytes; raises TokenizerError on a bad table."""
    if len(data) < 8 or data[:4] != VOCAB_MAGIC:
        raise TokenizerError("not a specmesh vocab table (bad magic)")
    version, n = struct.unpack_from("<HH", data, 4)
    if version != VOCAB_VERSION:
        raise TokenizerError("vocab table version %d is not supported" % version)
    end = 8 + 2 * (n + 1)
    if len(data) < end:
        raise TokenizerError("vocab table is truncated")
    offs = struct.unpack_from("<%dH" % (n + 1), data, 8)
    if len(data) != end + offs[-1] or any(a > b for a, b in zip(offs, offs[1:])):
        raise TokenizerError("vocab table is corrupt (offsets do not match its length)")
    blob = data[end:]
    return [blob[offs[i]:offs[i + 1]] for i in range(n)]


def vocab_id(data: bytes) -> int:
    """Tokenizer id stored in model headers: CRC-32 of the vocab.bin bytes."""
    return zlib.crc32(data) & 0xFFFFFFFF


def read_llama2c_tokenizer(path: str | Path, vocab_size: int) -> tuple[list[bytes], list[float]]:
    """(pieces, scores) of a llama2.c tokenizer.bin: i32 max_len, then per token f32 score, i32 len, bytes."""
    data = Path(path).read_bytes()
    pieces, scores, off = [], [], 4
    try:
        for _ in range(vocab_size):
            score, n = struct.unpack_from("<fi", data, off)
            off += 8
            if n < 0 or off + n > len(data):
                raise struct.error("bad length")
            pieces.append(data[off:off + n])
            scores.append(score)
            off += n
    except struct.error:
        raise TokenizerError("%s is not a llama2.c tokenizer.bin for %d tokens (truncated or corrupt)"
                             % (path, vocab_size)) from None
    return pieces, scores


class Tokenizer:
    """encode(str) -> list[int] and decode(list[int]) -> str.

    From tokenizer.json (encode and decode, via the `tokenizers` library) or from a list of token
    byte strings (vocab.bin or llama2.c's tokenizer.bin; decode only).
    """

    def __init__(self, pieces: list[bytes], hf=None):
        self.pieces = pieces
        self._hf = hf

    @classmethod
    def from_json(cls, path: str | Path) -> "Tokenizer":
        from tokenizers import Tokenizer as HF

        try:
            hf = HF.from_file(str(path))
        except Exception as e:  # the library raises a bare Exception on a bad file
            raise TokenizerError("cannot load tokenizer %s: %s" % (path, e)) from None
        return cls(pieces_of(hf), hf)

    @classmethod
    def from_vocab_bin(cls, path: str | Path) -> "Tokenizer":
        return cls(unpack_vocab(Path(path).read_bytes()))

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def encode(self, text: str, bos: bool = True) -> list[int]:
        if self._hf is None:
            raise TokenizerError("this tokenizer was loaded from a vocab table and can only decode")
        ids = self._hf.encode(text).ids
        return [BOS] + ids if bos else ids

    def encode_batch(self, texts: list[str], bos: bool = True) -> list[list[int]]:
        if self._hf is None:
            raise TokenizerError("this tokenizer was loaded from a vocab table and can only decode")
        head = [BOS] if bos else []
        return [head + e.ids for e in self._hf.encode_batch(texts)]

    def decode_bytes(self, ids) -> bytes:
        return b"".join(self.pieces[i] for i in ids)

    def decode(self, ids) -> str:
        return self.decode_bytes(ids).decode("utf-8", "replace")


def pieces_of(hf) -> list[bytes]:
    """Raw bytes of every token of a byte-level BPE `tokenizers.Tokenizer` (special tokens empty)."""
    from tokenizers import pre_tokenizers

    inv = {c: b for b, c in _byte_to_unicode(pre_tokenizers.ByteLevel.alphabet()).items()}
    specials = {t.content for t in hf.get_added_tokens_decoder().values()}
    vocab = hf.get_vocab(with_added_tokens=True)
    out = [b""] * len(vocab)
    for tok, i in vocab.items():
        out[i] = b"" if tok in specials else bytes(inv[c] for c in tok)
    return out


def _byte_to_unicode(alphabet) -> dict[int, str]:
    """GPT-2's byte -> printable character map, which the ByteLevel pre-tokenizer uses."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = list(bs), 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    m = {b: chr(c) for b, c in zip(bs, cs)}
    if set(m.values()) != set(alphabet):
        raise TokenizerError("unexpected ByteLevel alphabet in this version of `tokenizers`")
    return m
