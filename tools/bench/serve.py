"""Benchmark of `specmesh serve`'s batching: aggregate tokens/s of 16 concurrent streams against one stream,
side by side, on host back-ends (the `cpu` verifier and drafter, the shipped models).

    python -m specmesh.tools.bench serve

One stream: a mesh of one lane generating one request at a time (what `specmesh run --verifier cpu --drafter
cpu` does). Sixteen: a mesh of 16 lanes (host/cli/session.py), 16 threads each generating one request at
once, the verifier's and the drafter's forwards batched across streams (host/backends/batcher.py). Both
through `Mesh.stream`, the path `specmesh serve` takes (no HTTP: the server adds the same per-request cost to
both). Greedy, 64 tokens per request, the same 16 prompts; each figure is total generated tokens over wall
time; the goal (issue 31) is 16 streams at >= 4x one. The texts must be equal stream for stream.
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


def _generate(mesh, prompt: str) -> tuple[str, int]:
    done = None
    for item in mesh.stream(prompt, max_tokens=TOKENS):
        done = item
    return done.text, len(done.token_ids)


def run() -> dict:
    from specmesh import Mesh

    with Mesh(drafter="cpu", verifier="cpu", models=MODELS) as one:
        _generate(one, PROMPTS[0])  # warm-up
        t0 = time.perf_counter()
        alone = [_generate(one, p) for p in PROMPTS]
        one_s = time.perf_counter() - t0
    with Mesh(drafter="cpu", verifier="cpu", models=MODELS, streams=STREAMS) as many:
        _generate(many, PROMPTS[0])
        out: list = [None] * STREAMS
        threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, _generate(many, PROMPTS[i])))
                   for i in range(STREAMS)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        many_s = time.perf_counter() - t0
        verifier = many._setup._batchers["verifier"].stats
    tokens_one, tokens_many = sum(n for _, n in alone), sum(n for _, n in out)
    one_rate, many_rate = tokens_one / one_s, tokens_many / many_s
    ratio = many_rate / one_rate
    row = {"streams": STREAMS, "tokens_per_request": TOKENS, "one_stream_tokens_per_s": one_rate,
           "aggregate_tokens_per_s": many_rate, "ratio": ratio, "goal": GOAL, "met": ratio >= GOAL,
           "texts_equal": [t for t, _ in out] == [t for t, _ in alone],
           "verifier_requests_per_pass": verifier["requests_per_batch"]}
    print("serve batching (cpu verifier and drafter, shipped models, greedy, %d tokens a request)" % TOKENS)
    print("%-22s %10s" % ("", "tok/s"))
    print("%-22s %10.1f" % ("1 stream", one_rate))
    print("%-22s %10.1f  (%.2fx one; goal >= %.0fx: %s; %.1f verifier requests a pass; texts equal: %s)" % (
        "%d streams, aggregate" % STREAMS, many_rate, ratio, GOAL, "met" if row["met"] else "MISSED",
        row["verifier_requests_per_pass"], row["texts_equal"]))
    return row
