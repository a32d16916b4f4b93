"""Train the family's tokenizer: byte-level BPE, vocabulary exactly 512 (1 special + 256 bytes + 255 merges).

Writes models/tokenizer.json (host encode/decode, see host/tokenizer.py) and models/vocab.bin (the
compact table a board holds). Byte-level means any text encodes; no unknown token exists.

    python -m tools.tokenizer [--corpus corpus/train.txt] [--out models]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from host.tokenizer import BOS, Tokenizer, pack_vocab, pieces_of, vocab_id

VOCAB_SIZE = 512
SPECIAL = "<s>"


def train(corpus: Path, out: Path, vocab_size: int = VOCAB_SIZE) -> int:
    """Train on `corpus`, write tokenizer.json and vocab.bin into `out`; returns the tokenizer id."""
    from tokenizers import Tokenizer as HF, decoders, models, pre_tokenizers, trainers

    tok = HF(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[SPECIAL], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(corpus)], trainer)
    if tok.get_vocab_size() != vocab_size or tok.token_to_id(SPECIAL) != BOS:
        raise RuntimeError("tokenizer training gave %d tokens (wanted %d)" % (tok.get_vocab_size(), vocab_size))
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    table = pack_vocab(pieces_of(tok))
    (out / "vocab.bin").write_bytes(table)
    return vocab_id(table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, default=Path("corpus/train.txt"))
    ap.add_argument("--out", type=Path, default=Path("models"))
    a = ap.parse_args(argv)
    if not a.corpus.exists():
        print("tokenizer: %s not found: run `python -m tools.corpus` first" % a.corpus, file=sys.stderr)
        return 1
    tid = train(a.corpus, a.out)
    tok = Tokenizer.from_json(a.out / "tokenizer.json")
    sample = a.corpus.read_text("utf-8")[:200000]
    n = len(tok.encode(sample, bos=False))
    print("tokenizer: vocab %d, id %08x, %.2f bytes/token on the corpus head"
          % (tok.vocab_size, tid, len(sample.encode()) / n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
