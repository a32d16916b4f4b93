"""Build a drafter's n-gram table (shared/ngram.py) from the target's own greedy continuations.

The target (int8, host/backends/engine.py: the numbers every runtime computes) continues the opening of each
TinyStories training paragraph (models/tinystories_train_head.txt; none of the held-out prompts) at several
prompt lengths, greedily, for CONTINUE tokens. Each context of NMIN..NMAX tokens before a continued token is
counted with the token that followed it; a context is kept when it was seen at least MIN_COUNT times and one
token followed it at least MIN_SHARE of them (that token is its entry), unless a lookup would give that token
without it (a shorter context held gives the same). The file then holds each kept context's shorter ones too,
as marks where they have no token (suffix-closed: a lookup walks the lengths up and stops at the first not held).
Chosen on the tuning set's prompts (tools/heldout.py) with the classic ESP32's drafter, models/MODEL_CARD.md.

The continuations are a pure function of the shipped target and the text, so a re-run rebuilds the same table.
About fifteen minutes on 2 cores (one worker process a core).

    python -m specmesh.tools.ngram [--out models/drafter-esp32.ngt] [--workers 2]
"""

from __future__ import annotations

import argparse
import os
import struct
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from specmesh.host import atomic
from specmesh.host.layout import MODELS, TARGET_FILE
from specmesh.shared.ngram import CHUNK, MARK, SLOT_SIZE, hashes, header, parse_header

PROMPT_LENGTHS = (4, 8, 12, 16, 24, 32, 48)  # tokens of each paragraph's opening that the target continues
CONTINUE = 64  # greedy tokens a continuation
NMIN, NMAX = 2, 32  # context lengths the table keys on
MIN_COUNT = 2  # times a context must have been seen
MIN_SHARE = 0.6  # of them, the share its most frequent next token must have
LOAD = 0.7  # the most entries a table holds per slot (linear probing stays short)
OUT = MODELS / "drafter-esp32.ngt"


def greedy_stream(eng, prompt: Sequence[int], new: int) -> list[int]:
    """`prompt` and the `new` tokens the engine's model (host/backends/engine.py Engine) continues it with greedily."""
    from specmesh.host.backends.engine import argmax

    seq = list(prompt)
    eng.reset()
    logits = eng.forward(seq, 0)
    for _ in range(new):
        seq.append(argmax(logits[-1]))
        logits = eng.forward(seq[-1:], len(seq) - 1)
    return seq


def continuations(stories: Sequence[str], lengths: Sequence[int] = PROMPT_LENGTHS, new: int = CONTINUE,
                  target: Path = MODELS / TARGET_FILE) -> list[tuple[int, list[int]]]:
    """(prompt length, prompt + the target's `new` greedy tokens) for each story long enough, each length."""
    from specmesh.host.backends.engine import Engine
    from specmesh.host.decode.tokenizer import Tokenizer

    tok = Tokenizer.from_llama2c(target.parent / "tokenizer.bin")
    eng = Engine(target)
    out = []
    for s in stories:
        ids = tok.encode(s)
        for n in lengths:
            if len(ids) >= n + 4:
                out.append((n, greedy_stream(eng, ids[:n], new)))
    return out


def entries(seqs: Iterable[tuple[int, list[int]]], nmin: int = NMIN, nmax: int = NMAX, min_count: int = MIN_COUNT,
            min_share: float = MIN_SHARE) -> dict[tuple[int, ...], int]:
    """Context -> the token the table gives it, from continuations (only their continued tokens count)."""
    seen: dict[tuple[int, ...], Counter] = defaultdict(Counter)
    for start, seq in seqs:
        for i in range(max(start, nmin), len(seq)):
            for n in range(nmin, min(nmax, i) + 1):
                seen[tuple(seq[i - n:i])][seq[i]] += 1
    kept = {}
    for ctx, c in seen.items():
        (token, k), = c.most_common(1)
        total = sum(c.values())
        if total >= min_count and k >= min_share * total:
            kept[ctx] = token
    # a context whose token a lookup would reach without it (the longest shorter context held) is left out:
    # shortest first, so each one's fallback is already what the smaller table gives; lookups stay the same
    out: dict[tuple[int, ...], int] = {}
    for ctx in sorted(kept, key=len):
        if next((out[ctx[-n:]] for n in range(len(ctx) - 1, nmin - 1, -1) if ctx[-n:] in out), -1) != kept[ctx]:
            out[ctx] = kept[ctx]
    return out


def suffix_closed(table: dict[tuple[int, ...], int], nmin: int = NMIN) -> dict[tuple[int, ...], int]:
    """`table` and, as MARK, each shorter context (its newest tokens, at least nmin) of one it holds that it does not
    hold itself: a lookup walking the lengths up then stops at the first one not held (shared/ngram.py)."""
    out = dict(table)
    for ctx in table:
        for n in range(nmin, len(ctx)):
            out.setdefault(ctx[-n:], MARK)
    return out


def table_bytes(table: dict[tuple[int, ...], int], nmin: int = NMIN, nmax: int = NMAX,
                reach: int = max(PROMPT_LENGTHS) + CONTINUE) -> bytes:
    """The table file (shared/ngram.py's layout) holding `table` (suffix-closed here), contexts in a fixed order;
    `reach`, the longest stream its contexts were counted in (past it a lookup gives nothing: the target's text
    there, its loops, is not what the table saw)."""
    table = suffix_closed(table, nmin)
    slots = 1
    while len(table) > LOAD * slots:
        slots *= 2
    body = bytearray(slots * SLOT_SIZE)
    for ctx in sorted(table, key=lambda c: (len(c), c)):
        h, g = hashes(ctx, len(ctx), len(ctx))
        s = h & (slots - 1)
        while body[s * SLOT_SIZE + 2] | body[s * SLOT_SIZE + 3]:
            s = (s + 1) & (slots - 1)
        value = table[ctx] if table[ctx] == MARK else table[ctx] + 1
        struct.pack_into("<HH", body, s * SLOT_SIZE, g, value)
    return header(nmin, nmax, slots, len(table), reach) + bytes(body) + bytes(body[:(CHUNK - 1) * SLOT_SIZE])


def build(text: Path, workers: int) -> bytes:
    stories = [s.strip() for s in text.read_text("utf-8").split("\n\n") if s.strip()]
    with ProcessPoolExecutor(workers) as pool:  # every worker's stories in turn: the same order each run
        seqs = [x for part in pool.map(continuations, [stories[i::workers] for i in range(workers)]) for x in part]
    return table_bytes(entries(seqs))


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m specmesh.tools.ngram", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--text", type=Path, default=MODELS / "tinystories_train_head.txt")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args(argv)
    data = build(a.text, max(1, a.workers))
    atomic.write_bytes(a.out, data)
    print("%s: %d entries, %d bytes" % (a.out, parse_header(data)[3], len(data)))


if __name__ == "__main__":
    main()
