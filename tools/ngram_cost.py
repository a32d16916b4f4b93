"""A drafter board's n-gram lookups (shared/ngram.py), in executed instructions: virtual boards running their own
machine code under QEMU (`-icount shift=0`: time.ticks_cpu() counts executed instructions, on the Xtensa core to
25) look the shipped table up, from a file on their own filesystem as a drafter node does, after every prefix of
the target's greedy streams of held-out prompts (64 tokens after each, as the bench decodes them). Each board's
tokens must be the host's lookups; its mean instructions a lookup is host/projection/hardware.py's
NGRAM_LOOKUP_INSNS (the classic ESP32, Xtensa) and NGRAM_LOOKUP_INSNS_RV32 (the ESP32-C3), from the tuning set.

    python -m specmesh.tools.ngram_cost [--set tinystories|handwritten] [--prompts 64]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from array import array
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

from specmesh.tools import last_line, run_tool
from specmesh.host import tempdirs
from specmesh.host.cli.flags import a_path
from specmesh.host.cli.ranges import RangeError, in_range
from specmesh.host.layout import MODELS, ROOT, TARGET_FILE, ngram_table
from specmesh.tools.heldout import PROMPT_SETS, prompt_set
from specmesh.tools.ngram import greedy_stream

NEW = 64  # greedy tokens after each prompt (tools/bench/projection.py NEW)
BOARDS = {"esp32": "xtensa", "esp32c3": "rv32"}  # class -> the ISA its virtual board executes
SCRIPT = """
import time
from array import array
from shared import ngram
T, D = time.ticks_cpu, time.ticks_diff
with open("table.ngt", "rb") as src, open("/lookup-cost.ngt", "wb") as dst:  # onto the board's own filesystem
    while True:
        b = src.read(2048)
        if not b:
            break
        dst.write(b)
t = ngram.Table(open("/lookup-cost.ngt", "rb"))
def gap():
    a = T()
    return D(T(), a)
base = min(gap() for _ in range(20))  # the clock reads' own
with open("streams.bin", "rb") as f:
    while True:
        head = f.read(2)
        if len(head) < 2:
            break
        s = array("H", f.read(2 * head[1]))
        tokens, counts = [], []
        for end in range(head[0], len(s)):
            a = T()
            k = t.get(s, end)
            counts.append(D(T(), a) - base)
            tokens.append(k)
        print("stream", " ".join(str(x) for x in tokens), "|", " ".join(str(x) for x in counts))
t.close()
import os
os.remove("/lookup-cost.ngt")
"""


def streams(set_name: str, n: int) -> list[tuple[int, list[int]]]:
    """(prompt length, prompt + the int8 target's NEW greedy tokens) for the set's first n prompts."""
    from specmesh.host.backends import EngineStream
    from specmesh.host.decode.tokenizer import Tokenizer

    tok = Tokenizer.from_llama2c(MODELS / "tokenizer.bin")
    with closing(EngineStream(MODELS / TARGET_FILE)) as stream:
        return [(len(p), greedy_stream(stream.engine, p, NEW)) for p in prompt_set(set_name, MODELS, tok, n)]


def measure(board: str, table: Path, seqs: Sequence[tuple[int, list[int]]]) -> tuple[list[int], list[int]]:
    """(the virtual `board`'s lookup after every prefix past each prompt, instructions of each)."""
    from specmesh.host.emulator import make_board

    mpremote = str(Path(sys.executable).with_name("mpremote"))
    with tempdirs.folder("ngram-cost") as tmp:
        work = Path(tmp) / "mount"
        shutil.copytree(ROOT / "shared", work / "shared")
        shutil.copy(table, work / "table.ngt")
        with open(work / "streams.bin", "wb") as f:
            for start, seq in seqs:
                f.write(bytes((start, len(seq))) + array("H", seq).tobytes())
        (work / "run.py").write_text(SCRIPT)
        vb = make_board(Path(tmp) / "board", board, qemu=True).start()
        try:
            out = subprocess.run([mpremote, "connect", vb.port, "mount", str(work), "run", str(work / "run.py")],
                                 capture_output=True, text=True, timeout=1800)
        finally:
            vb.stop()
    if out.returncode:
        raise SystemExit("ngram_cost: the virtual %s did not run the lookups: %s" % (board, last_line(out.stderr)))
    tokens: list[int] = []
    counts: list[int] = []
    for line in out.stdout.splitlines():
        if line.startswith("stream "):
            got, cost = line[len("stream "):].split("|")
            tokens += [int(x) for x in got.split()]
            counts += [int(x) for x in cost.split()]
    return tokens, counts


def main(argv: Sequence[str] | None = None) -> None:
    from specmesh.host.backends import load_ngram_table

    ap = argparse.ArgumentParser(prog="python -m specmesh.tools.ngram_cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=PROMPT_SETS, default=PROMPT_SETS[0],
                    help="held-out prompts (default: tinystories, the tuning set)")
    ap.add_argument("--prompts", type=int, default=64, help="the first N prompts of the set (default: %(default)s)")
    ap.add_argument("--model", type=a_path, default=MODELS / "drafter-esp32.spm",
                    help="the drafter beside its table (default: models/drafter-esp32.spm)")
    a = ap.parse_args(argv)
    try:  # no prompt measures nothing (a division by zero after the virtual boards ran), a negative one fewer prompts
        in_range("--prompts", a.prompts, 1)
    except RangeError as e:
        ap.exit(2, "ngram_cost: %s\n" % e)
    if not a.model.is_file():
        ap.exit(1, "ngram_cost: no model file %s: give --model a drafter's .spm\n" % a.model)
    table, host = ngram_table(a.model), load_ngram_table(a.model)  # a corrupt table: one line (run_tool), no streams
    if table is None or host is None:
        ap.exit(1, "ngram_cost: no n-gram table beside %s: build it with python -m specmesh.tools.ngram\n" % a.model)
    seqs = streams(a.set, a.prompts)
    want = [host.get(seq, end) for start, seq in seqs for end in range(start, len(seq))]
    print("%s: %d lookups after %d %s prompts' greedy streams, %d held" % (
        table.name, len(want), len(seqs), a.set, sum(k >= 0 for k in want)))
    for board, isa in BOARDS.items():
        got, counts = measure(board, table, seqs)
        if got != want:
            raise SystemExit("ngram_cost: the virtual %s's lookups differ from the host's" % board)
        c = sorted(counts)
        print("virtual %s (%s): %.0f instructions a lookup on average; median %d, 90th percentile %d, most %d" % (
            board, isa, sum(c) / len(c), c[len(c) // 2], c[9 * len(c) // 10], c[-1]))


if __name__ == "__main__":
    run_tool("ngram_cost", main)
