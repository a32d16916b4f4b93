"""Bytes of a packed row of the residual stream (shared/rows.py) at each layer boundary of the shipped target,
measured over held-out text: what a pipeline stage's row costs on the wire (host/projection/hardware.py keeps
the figures, PACKED_ROW_BYTES; tests/test_rowwidths.py checks that they are this tool's current measurement).

    python -m specmesh.tools.rowwidths

The numpy engine (host/backends/engine.py, bit-identical to the boards' engine) runs the first TOKENS tokens
of STORIES acceptance stories (tools/heldout.py); each layer's input rows are recorded (the input of layer b
is what a stage ending at layer b sends on), packed row by row at the width each needs.
"""

from __future__ import annotations

import argparse
from collections import Counter

from specmesh.tools import run_tool
from specmesh.host.backends.engine import Engine
from specmesh.host.decode.tokenizer import Tokenizer
from specmesh.host.layout import MODELS, TARGET_FILE
from specmesh.shared import rows
from specmesh.tools.heldout import FIRST_STORY, heldout_stories

STORIES = 8
TOKENS = 128


def measure(stories: int = STORIES, tokens: int = TOKENS) -> dict[int, Counter]:
    """{boundary b (rows leaving layers :b): Counter of the widths its rows needed}, b = 1..n_layers (the last:
    what the last stage answers for a position it does not judge, a prompt's)."""
    engine = Engine(MODELS / TARGET_FILE)
    model = engine.model
    dim = engine.header.dim
    n_layers = engine.header.n_layers
    widths: dict[int, Counter] = {b: Counter() for b in range(1, n_layers + 1)}
    for b in widths:  # layer b's attention norm (the final norm after the last) sees the rows layer b - 1 left
        norm = model.layers[b]["attn_norm"] if b < n_layers else model.final_norm

        def record(x, norm=norm, seen=widths[b]):
            for row in model.xp.numpy(x).astype(int).tolist():
                seen[rows.width(row, 0, dim)] += 1
            return norm(x)

        if b < n_layers:
            model.layers[b]["attn_norm"] = record
        else:
            model.final_norm = record
    tok = Tokenizer.from_llama2c(MODELS / "tokenizer.bin")
    texts = heldout_stories(MODELS / "heldout.txt")[FIRST_STORY:]
    done = 0
    for text in texts:
        ids = tok.encode(text)[:min(tokens, engine.n_ctx)]
        if len(ids) < tokens // 2:
            continue
        engine.reset()
        engine.forward(ids, 0)
        done += 1
        if done == stories:
            break
    return widths


def mean_bytes(widths: dict[int, Counter], dim: int) -> dict[int, float]:
    """Mean bytes of a packed row at each boundary, rounded to 0.1 byte."""
    return {b: round(sum(rows.row_bytes(dim, w) * n for w, n in c.items()) / sum(c.values()), 1)
            for b, c in widths.items()}


def main() -> int:
    engine_dim = Engine(MODELS / TARGET_FILE).header.dim
    widths = measure()
    print("packed rows of the shipped target's residual stream, %d held-out stories x %d tokens (int32: %d bytes)"
          % (STORIES, TOKENS, 4 * engine_dim))
    for b, mean in mean_bytes(widths, engine_dim).items():
        c = widths[b]
        print("after layer %d: %.1f bytes a row (widths %s)" % (b - 1, mean, ", ".join(
            "%d B: %d" % (w, n) for w, n in sorted(c.items()))))
    return 0


if __name__ == "__main__":
    # no flags: --help says what it measures, a stray argument is a usage error (it ran the measurement)
    argparse.ArgumentParser(prog="python -m specmesh.tools.rowwidths", description=__doc__.split("\n\n")[0]).parse_args()
    run_tool("rowwidths", main)
