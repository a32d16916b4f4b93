"""Tokenizers at run time: llama2.c's tokenizer.bin (host encode and decode) and the board vocab table
(vocab.bin, decode only), behind one interface.

tokenizer.bin (llama2.c, little-endian): i32 max_token_length, then per token f32 score, i32 length,
the piece's bytes. Ids 0/1/2 are `<unk>`, `<s>` (BOS), `</s>` (EOS); a piece `<0xNN>` is the raw byte NN.

vocab.bin (little-endian), small enough for a board to `readinto` one buffer:
    magic b"SPMV", u16 version (1), u16 n_tokens, u16 offsets[n_tokens + 1], then the token bytes
    concatenated; token i is bytes[offsets[i]:offsets[i + 1]] (special tokens are empty, byte tokens
    hold their byte).
The tokenizer id in a model header is `vocab_id(vocab.bin bytes)`: the CRC-32 of the whole table.
"""

from __future__ import annotations

import heapq
import struct
import zlib
from pathlib import Path

VOCAB_MAGIC = b"SPMV"
VOCAB_VERSION = 1
BOS = 1  # "<s>": starts every story
EOS = 2  # "</s>": ends one
SPECIALS = 3  # ids 0, 1, 2: <unk>, <s>, </s>


class TokenizerError(Exception):
    """A tokenizer file that cannot be used; the message says what is wrong."""


def pack_vocab(pieces: list[bytes]) -> bytes:
    """The vocab.bin bytes for a list of token byte strings."""
    offs, n = [0], 0
    for p in pieces:
        n += len(p)
        offs.append(n)
    if n > 0xFFFF:
        raise TokenizerError("the %d tokens' pieces take %d bytes, a vocab table holds 65,535 (16-bit offsets, the "
                             "boards' format): a vocabulary this large does not fit" % (len(pieces), n))
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


def read_llama2c_tokenizer(path: str | Path, vocab_size: int | None = None) -> tuple[list[bytes], list[float]]:
    """(pieces, scores) of a llama2.c tokenizer.bin: i32 max_len, then per token f32 score, i32 len, bytes.

    With `vocab_size` None, reads every entry to the end of the file."""
    data = Path(path).read_bytes()
    pieces, scores, off = [], [], 4
    try:
        if len(data) < 4:
            raise struct.error("no header")
        while (off < len(data)) if vocab_size is None else (len(pieces) < vocab_size):
            score, n = struct.unpack_from("<fi", data, off)
            off += 8
            if n < 0 or off + n > len(data):
                raise struct.error("bad length")
            pieces.append(data[off:off + n])
            scores.append(score)
            off += n
    except struct.error:
        raise TokenizerError("%s is not a llama2.c tokenizer.bin%s (truncated or corrupt)"
                             % (path, "" if vocab_size is None else " for %d tokens" % vocab_size)) from None
    return pieces, scores


def byte_pieces(pieces: list[bytes]) -> list[bytes]:
    """llama2.c pieces as the bytes they stand for: `<0xAB>` byte tokens decoded, specials emptied."""
    out = []
    for p in pieces:
        if len(p) == 6 and p.startswith(b"<0x") and p.endswith(b">"):
            out.append(bytes([int(p[3:5], 16)]))
        elif len(out) < SPECIALS:
            out.append(b"")
        else:
            out.append(p)
    return out


def lone_surrogate(text: str) -> int | None:
    """Where `text` holds its first lone UTF-16 surrogate (a JSON escape or a Python string can spell one; no UTF-8
    text holds it, so the tokenizer cannot encode it), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return e.start
    return None


class Tokenizer:
    """encode(str) -> list[int] and decode(list[int]) -> str.

    From llama2.c's tokenizer.bin (encode and decode) or from vocab.bin (decode only).

    The encoder is hand-written: llama2.c's tokenizer.bin keeps only pieces and scores (no
    sentencepiece model, no merge list), and its `run.c` encodes by repeatedly merging the adjacent
    pair whose concatenation is the best-scoring piece; no library applies that rule to these files,
    and a merge list rebuilt from the scores need not reproduce it. This is run.c's `encode`.
    """

    def __init__(self, pieces: list[bytes], scores: list[float] | None = None):
        self.pieces = byte_pieces(pieces)
        self._raw = list(pieces)  # as tokenizer.bin spells them (byte tokens as `<0xNN>`): what merges match
        self._ids = None if scores is None else {p: i for i, p in enumerate(pieces)}
        self._scores = scores

    @classmethod
    def from_llama2c(cls, path: str | Path, vocab_size: int | None = None) -> "Tokenizer":
        pieces, scores = read_llama2c_tokenizer(path, vocab_size)
        if len(pieces) < SPECIALS + 256:
            raise TokenizerError("%s holds %d tokens: a llama2.c tokenizer has 3 specials and 256 byte tokens"
                                 % (path, len(pieces)))
        return cls(pieces, scores)

    @classmethod
    def of_models(cls, models: Path) -> "Tokenizer":
        """The tokenizer.bin of the models folder `models` (a run's --models, modelcard's, export's --out); one that
        does not parse is a TokenizerError that says what to do (it said only "not a llama2.c tokenizer.bin
        (truncated or corrupt)")."""
        from specmesh.host.layout import MODELS, TOKENIZER_FILE

        try:
            return cls.from_llama2c(Path(models) / TOKENIZER_FILE)
        except TokenizerError as e:
            raise TokenizerError("%s: copy the models' own %s there again (the shipped one is in %s)"
                                 % (e, TOKENIZER_FILE, MODELS)) from None

    @classmethod
    def from_vocab_bin(cls, path: str | Path) -> "Tokenizer":
        return cls(unpack_vocab(Path(path).read_bytes()))

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def least_tokens(self, text: str, bos: bool = True) -> int:
        """A lower bound of len(encode(text, bos)) without encoding it (a megabyte takes seconds): its UTF-8
        bytes (and the dummy-prefix space) over the longest piece's, and the BOS. UnicodeEncodeError as encode."""
        longest = max(len(p) for p in self.pieces)
        return int(bos) + (-(-(len(text.encode("utf-8")) + 1) // longest) if text else 0)

    def encode(self, text: str, bos: bool = True, eos: bool = False) -> list[int]:
        """llama2.c's encoding: a dummy-prefix space, each UTF-8 character as a piece or its bytes
        (id byte + 3), then merges of the adjacent pair forming the best-scoring piece."""
        ids, scores = self._ids, self._scores
        if ids is None or scores is None:
            raise TokenizerError("this tokenizer was loaded from a vocab table and can only decode")
        out = []
        if text:
            for ch in " " + text:
                b = ch.encode("utf-8")
                out += [ids[b]] if b in ids else [c + 3 for c in b]
        out = self._merge(out)
        return ([BOS] if bos else []) + out + ([EOS] if eos else [])

    def _merge(self, tok: list[int]) -> list[int]:
        """run.c's merge loop (best score first, leftmost on ties) with a heap of adjacent pairs, so
        a long text costs n log n rather than run.c's n^2; a popped pair is used only if still current."""
        ids, scores, raw = self._ids, self._scores, self._raw
        n = len(tok)
        nxt = list(range(1, n + 1))
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int, int]] = []

        def push(i: int) -> None:
            j = nxt[i]
            if j < n:
                m = ids.get(raw[tok[i]] + raw[tok[j]])
                if m is not None:
                    heapq.heappush(heap, (-scores[m], i, j, tok[i] * 65536 + tok[j], m))

        for i in range(n - 1):
            push(i)
        alive = [True] * n
        while heap:
            _, i, j, pair, m = heapq.heappop(heap)
            if not (alive[i] and alive[j] and nxt[i] == j and tok[i] * 65536 + tok[j] == pair):
                continue
            tok[i], alive[j], nxt[i] = m, False, nxt[j]
            if nxt[j] < n:
                prv[nxt[j]] = i
            if prv[i] >= 0:
                push(prv[i])
            push(i)
        return [t for t, a in zip(tok, alive) if a]

    def decode_bytes(self, ids) -> bytes:
        return b"".join(self.pieces[i] for i in ids)

    def decode(self, ids) -> str:
        """The text of `ids`; the dummy-prefix space after BOS is dropped, as llama2.c does."""
        ids = list(ids)
        text = self.decode_bytes(ids).decode("utf-8", "replace")
        return text[1:] if ids and ids[0] == BOS and text.startswith(" ") else text
