"""Build the board drafters' n-gram tables (shared/ngram.py), and the target's, from its own greedy continuations.

The target (int8, host/backends/engine.py: the numbers every runtime computes) continues openings at several
prompt lengths, greedily, for CONTINUE tokens: those of each TinyStories training paragraph
(models/tinystories_train_head.txt; none of the held-out prompts) and those of SAMPLED stories it samples itself
(T = 1 from BOS: the text it writes, odd turns and all, which real prompts lead it into more than the paragraphs do).
Each context of NMIN..NMAX tokens before a continued token is
counted with the token that followed it, and with how often the drafter's own argmax there was that token. A
context is kept when one token followed it at least MIN_SHARE of the times (that token is its entry) and the entry
would have drafted at least MIN_GAIN more of its continued tokens right than what a lookup gives without it: the
longest shorter context held, else the drafter itself. So a drafter's table spends its slots where its drafter is
wrong, and never overrides it where it is right as often: each drafter gets a table of its own (`<drafter>.ngt`,
flashed beside it). The target's (`target.ngt`, on the host only) is counted as if no drafter drafted anything
right: the host copies its chains into the plain rounds of a drafter with a table (host/decode/lookup.py), where a
drafter's own table breaks off wherever its drafter is right. Each file holds each kept context's shorter ones too,
as marks where they have no token (suffix-closed: a lookup walks the lengths up and stops at the first not held).
Chosen on the tuning set's prompts (tools/heldout.py), docs/bench/ngram.md.

The continuations and the drafters' argmaxes are a pure function of the shipped models and the text, so a re-run
rebuilds the same tables. The models run in the board's engine and native kernels on the host where they can
(host/backends/pipeengine.py: about four minutes on 2 cores), else in the numpy engine (the same integers, about an
hour); counting the contexts, one context length at a time, takes about six minutes more and 1.3 GB of memory.

    python -m specmesh.tools.ngram [--drafter models/drafter-esp32.spm ...] [--workers 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import struct
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from contextlib import closing
from pathlib import Path

from specmesh.tools import run_tool, said
from specmesh.host import atomic
from specmesh.host.backends import EngineStream
from specmesh.host.cli.flags import a_path
from specmesh.host.cli.ranges import RangeError, in_range
from specmesh.host.boardclasses import ESP32, ESP32S3
from specmesh.host.layout import MODELS, TARGET_FILE, ngram_table_name
from specmesh.shared.modelfile import ModelFileError
from specmesh.shared.ngram import CHUNK, MARK, SLOT_SIZE, hashes, header, parse_header

PROMPT_LENGTHS = tuple(range(4, 49, 2))  # tokens of each paragraph's opening that the target continues
CONTINUE = 64  # greedy tokens a continuation
SAMPLED = 1024  # stories the target samples itself (T = 1 from BOS, seeds 0 ..), whose openings it continues too
OPENING = max(PROMPT_LENGTHS)  # tokens of each sampled story after BOS, continued from its prefixes of PROMPT_LENGTHS
NMIN, NMAX = 2, 32  # context lengths the table keys on
MIN_SHARE = 0.6  # of a context's continued tokens, the share its entry must have been
MIN_GAIN = 5  # continued tokens an entry must draft right beyond what a lookup gives without it
LOAD = 0.7  # the most entries a table holds per slot (linear probing stays short)
# the board classes' drafters, each shipped with its table; the target's table is built beside them, counted as if
# no drafter drafted anything right (the host copies its chains: host/decode/lookup.py)
DRAFTERS = (ESP32.drafter, ESP32S3.drafter)


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


def sampled_openings(seeds: Iterable[int], target: Path = MODELS / TARGET_FILE) -> list[list[int]]:
    """BOS and the OPENING tokens the target samples after it at T = 1 with each seed: its own stories' openings,
    drawn by the shared rule's integer sampling (host/decode/orchestrator.py, plain decoding): the same everywhere."""
    from specmesh.host.backends import LocalVerifier, SessionParams
    from specmesh.host.decode.orchestrator import generate
    from specmesh.host.decode.tokenizer import BOS

    ver = LocalVerifier(target)
    try:
        return [[BOS] + generate([BOS], ver, None, SessionParams(seed=s, temperature=1.0), OPENING).tokens
                for s in seeds]
    finally:
        ver.close()


def continuations(openings: Iterable[Sequence[int]], lengths: Sequence[int] = PROMPT_LENGTHS, new: int = CONTINUE,
                  target: Path = MODELS / TARGET_FILE) -> list[tuple[int, list[int]]]:
    """(prompt length, prompt + the target's `new` greedy tokens) for each opening long enough, each length."""
    out = []
    with closing(EngineStream(target)) as stream:  # the board's engine in a process where it runs, else numpy
        eng = stream.engine
        for ids in openings:
            for n in lengths:
                if len(ids) >= n + 4:
                    out.append((n, greedy_stream(eng, ids[:n], new)))
    return out


def hits(seqs: Iterable[tuple[int, list[int]]], drafter: Path) -> list[list[bool]]:
    """For each stream, whether the drafter's argmax after each prefix seq[:i] is seq[i] (False at i = 0): what it
    drafts there without a table (a greedy draft is tested only after the target's own tokens)."""
    from specmesh.host.backends.engine import argmax

    out = []
    with closing(EngineStream(drafter)) as stream:
        eng = stream.engine
        for _start, seq in seqs:
            eng.reset()
            logits = eng.forward(seq[:-1], 0)
            out.append([False] + [argmax(row) == t for row, t in zip(logits, seq[1:])])
    return out


def entries(seqs: Sequence[tuple[int, list[int]]], rights: Sequence[Sequence[Sequence[bool]]], nmin: int = NMIN,
            nmax: int = NMAX, min_share: float = MIN_SHARE,
            min_gain: int = MIN_GAIN) -> list[dict[tuple[int, ...], int]]:
    """For each drafter, context -> the token its table gives it, from continuations (only their continued tokens
    count) and `rights`, each drafter's hits on them (`hits`); the contexts are counted once for all drafters."""
    tables: list[dict[tuple[int, ...], int]] = [{} for _ in rights]
    # one context length at a time, shortest first: each context's fallback (the longest shorter one held) is then
    # already decided, and only one length's counts are held at once
    for n in range(nmin, nmax + 1):
        seen: dict[tuple[int, ...], Counter] = defaultdict(Counter)
        drafter_right: list[Counter] = [Counter() for _ in rights]
        for s, (start, seq) in enumerate(seqs):
            hit = [r[s] for r in rights]
            for i in range(max(start, n), len(seq)):
                ctx = tuple(seq[i - n:i])
                seen[ctx][seq[i]] += 1
                for d, h in enumerate(hit):
                    drafter_right[d][ctx] += h[i]
        for ctx, c in seen.items():
            (token, k), = c.most_common(1)  # one token: MIN_SHARE > 0.5 leaves no tie among those kept
            if k < min_share * sum(c.values()):
                continue
            for out, right in zip(tables, drafter_right):
                fallback = next((out[ctx[-m:]] for m in range(n - 1, nmin - 1, -1) if ctx[-m:] in out), None)
                if k - (right[ctx] if fallback is None else c[fallback]) >= min_gain:
                    out[ctx] = token
    return tables


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
    slots = CHUNK  # at least a read's worth, so that the file's mirror of its first CHUNK - 1 slots exists
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


def _work(stories: Sequence[str], seeds: Sequence[int], drafters: Sequence[Path | None]) -> tuple[list, list]:
    """One worker's continuations (of `stories`' openings, then of the target's own sampled with `seeds`) and each
    drafter's hits on them (None: no drafter, no hits)."""
    from specmesh.host.decode.tokenizer import Tokenizer

    tok = Tokenizer.from_llama2c(MODELS / "tokenizer.bin")
    seqs = continuations([tok.encode(s) for s in stories] + sampled_openings(seeds))
    return seqs, [hits(seqs, d) if d else [[False] * len(s) for _, s in seqs] for d in drafters]


def _worker_signals() -> None:
    """A worker leaves Ctrl-C to the builder, which ends it (SIGTERM) quietly, not with a traceback each."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def build(text: Path, drafters: Sequence[Path | None], workers: int, sampled: int = SAMPLED) -> list[bytes]:
    """Each drafter's table file (None: the target's), from the continuations of the paragraphs of `text` and of
    `sampled` openings of the target's own stories (seeds 0 ..). Its workers' forkserver imports the caller's main
    module, as 3.14's default does: a script that calls this needs the `if __name__ == "__main__":` guard."""
    stories = [s.strip() for s in text.read_text("utf-8").split("\n\n") if s.strip()]
    # a table counts its contexts, so the workers' order does not matter; the pool's exit ends them, so a Ctrl-C or a
    # kill leaves none running its minutes of continuations on. Forked by a forkserver, a process with one thread: a
    # caller with threads (a test's process, a host with its boards' threads) forked them itself on Linux's default
    # until Python 3.14 ("fork"), which can leave a worker a lock another thread held, and 3.12 warns of it
    with multiprocessing.get_context("forkserver").Pool(workers, _worker_signals) as pool:
        parts = pool.starmap(_work, zip([stories[i::workers] for i in range(workers)],
                                        [range(i, sampled, workers) for i in range(workers)], [drafters] * workers))
    seqs = [x for p, _ in parts for x in p]
    rights = [[h for _, hs in parts for h in hs[j]] for j in range(len(drafters))]
    return [table_bytes(t) for t in entries(seqs, rights)]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specmesh.tools.ngram", description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", type=a_path, action="append",
                    help="a drafter model file, its table written beside it; repeatable (default: %s, and the target's "
                         "table)"
                    % ", ".join(DRAFTERS))
    ap.add_argument("--text", type=a_path, default=MODELS / "tinystories_train_head.txt",
                    help="paragraphs (blank-line separated) whose openings the target continues (default: "
                         "models/tinystories_train_head.txt)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                    help="processes running the models, up to twice this machine's CPUs (default: its CPUs, "
                         "%(default)s)")
    a = ap.parse_args(argv)
    drafters: list[Path | None] = a.drafter or [*(MODELS / d for d in DRAFTERS), None]
    try:
        # each worker is a process holding the models: a typo such as --workers 20000 started that many at once
        in_range("--workers", a.workers, 1, 2 * (os.cpu_count() or 1), note="up to twice this machine's CPUs")
    except RangeError as e:
        print("ngram: %s" % e, file=sys.stderr)
        return 2
    try:
        outs = checked(a.text, drafters)
        tables = build(a.text, drafters, a.workers)
        for out, data in zip(outs, tables):
            atomic.write_bytes(out, data)
            print("%s: %d entries, %d bytes" % (out, parse_header(data)[3], len(data)))
    except (OSError, ValueError, ModelFileError) as e:
        print("ngram: %s" % said(e), file=sys.stderr)
        return 1
    return 0


def checked(text: Path, drafters: Sequence[Path | None]) -> list[Path]:
    """Each drafter's table file (None: the target's), once the text, the models and the tables' folders are
    checked (OSError, ValueError or ModelFileError saying which is wrong): before minutes of continuations."""
    from specmesh.host.backends.modelio import check_model_file

    try:
        text.read_text("utf-8")
    except UnicodeDecodeError as e:  # the decoder's own message names no file
        raise ValueError("--text %s is not UTF-8 text (byte %d)" % (text, e.start)) from None
    outs = []
    for d in drafters:
        model = d or MODELS / TARGET_FILE
        check_model_file(model)
        out = model.with_name(ngram_table_name(model.name))
        problem = atomic.unwritable(out)
        if problem:
            raise ValueError("the table %s cannot be written: %s" % (out, problem))
        outs.append(out)
    return outs


if __name__ == "__main__":
    run_tool("ngram", main)
