"""Benchmark of `specmesh serve`'s batching: aggregate tokens/s of 16 concurrent streams against one stream,
side by side, on host back-ends (the `cpu` verifier, the shipped models), speculative (the `cpu` drafter) and
plain (the verifier alone).

    python -m specmesh.tools.bench serve

One stream: a mesh of one lane generating one request at a time (what `specmesh run --verifier cpu` does).
Sixteen: a mesh of 16 lanes (host/cli/session.py), 16 threads each generating one request at once, each lane on
its own engine process (host/backends/pipeengine.py) where this host runs one, else the forwards of the verifier
(and of the drafter) batched across streams on numpy (host/backends/batcher.py); timed on the second of two
rounds (the first opens the lanes, which a server keeps). Both through `Mesh.stream`, the path `specmesh serve`
takes (no HTTP: the server adds the same per-request cost to both). Greedy, 64 tokens per request, the same 16
prompts; each figure is total generated tokens over wall time. The goal (issue 31) was 16 streams at >= 4x one,
set when one stream ran on numpy (142 tok/s); one stream on its engine process keeps about a core busy, so on 2
cores 16 gain what the second core gives. The texts must be equal stream for stream.
"""

from __future__ import annotations

import threading
import time

from specmesh.host.layout import MODELS

STREAMS = 16
TOKENS = 64
GOAL = 4.0
PROMPTS = ["Once upon a time", "The little dog", "One day, a girl", "Tom and Sue", "The sun was", "A big bear",
           "In the park", "The cat saw", "Lily wanted", "There was a tree", "Max liked", "The boat",
           "Mom said", "A bird sang", "The king had", "Ben found"]
MODES = {"speculative (cpu drafter)": {"drafter": "cpu"}, "plain": {"plain": True}}


def _generate(mesh, prompt: str) -> tuple[str, int]:
    done = None
    for item in mesh.stream(prompt, max_tokens=TOKENS):
        done = item
    return done.text, len(done.token_ids)


def _row(mode: str, flags: dict) -> dict:
    from specmesh import Mesh

    with Mesh(verifier="cpu", models=MODELS, **flags) as one:
        _generate(one, PROMPTS[0])  # warm-up
        t0 = time.perf_counter()
        alone = [_generate(one, p) for p in PROMPTS]
        one_s = time.perf_counter() - t0
    with Mesh(verifier="cpu", models=MODELS, streams=STREAMS, **flags) as many:
        out: list = [None] * STREAMS
        for _ in range(2):  # the first round opens the lanes (a server keeps them): the second is timed
            threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, _generate(many, PROMPTS[i])))
                       for i in range(STREAMS)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            many_s = time.perf_counter() - t0
        batcher = many._setup._batchers.get("verifier")
        per_pass = batcher.stats["requests_per_batch"] if batcher else None
    one_rate, many_rate = sum(n for _, n in alone) / one_s, sum(n for _, n in out) / many_s
    return {"mode": mode, "streams": STREAMS, "tokens_per_request": TOKENS, "one_stream_tokens_per_s": one_rate,
            "aggregate_tokens_per_s": many_rate, "ratio": many_rate / one_rate, "goal": GOAL,
            "met": many_rate / one_rate >= GOAL, "texts_equal": [t for t, _ in out] == [t for t, _ in alone],
            "engine": "numpy, batched" if batcher else "a process a lane", "verifier_requests_per_pass": per_pass}


def run() -> dict:
    rows = [_row(mode, flags) for mode, flags in MODES.items()]
    print("serve batching (cpu verifier, shipped models, greedy, %d tokens a request, %d streams)" % (TOKENS, STREAMS))
    print("%-26s %10s %12s %7s %6s %-18s %10s %6s" % ("mode", "1 tok/s", "16 agg tok/s", "ratio", "goal", "16 streams on",
                                                      "req / pass", "equal"))
    for r in rows:
        per_pass = r["verifier_requests_per_pass"]
        print("%-26s %10.1f %12.1f %6.2fx %6s %-18s %10s %6s" % (
            r["mode"], r["one_stream_tokens_per_s"], r["aggregate_tokens_per_s"], r["ratio"],
            "met" if r["met"] else "MISSED", r["engine"], "-" if per_pass is None else "%.1f" % per_pass,
            r["texts_equal"]))
    return {"rows": rows}
