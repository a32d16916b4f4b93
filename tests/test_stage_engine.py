"""Pipeline stages of the firmware engine (layers [a, b) each) under the real micropython binary.

A chain of stages, each handing its residual stream to the next exactly, gives the full model's logits
bit for bit: compared with the numpy engine (host/backends/arraymath.py) on held-out text of the shipped target,
for several splits, one and several positions per pass, and a greedy continuation. docs/pipeline.md.
"""

import numpy as np
import pytest

from tests.test_firmware_engine import fw_dir, reference, run_plan  # noqa: F401
from tests.test_firmware_engine_shipped import REF, chunks, shipped

SPLITS = [[[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]], [[0, 2], [2, 5]], [[0, 5]]]


@pytest.mark.parametrize("stages", SPLITS, ids=["5x1", "2+3", "1x5"])
def test_stage_chain_gives_the_full_models_logits(run_plan, stages):
    path = shipped("target")
    doc = np.load(REF)["target.tokens"][0][:40]
    ops = chunks(doc, 3) + [["greedy", 12]]
    got = run_plan({"model": path, "kmax": 3, "stages": stages, "ops": ops}, heap="64M")
    assert "error" not in got, got
    want = reference(path, ops)
    for g, w in zip(got["results"][:-1], want[:-1]):
        assert np.array_equal(np.array(g["logits"]), w["logits"])  # exact: integer arithmetic
        assert g["argmax"] == w["argmax"]
    assert got["results"][-1]["tokens"] == want[-1]["tokens"]


def test_a_stage_loads_only_its_layers(run_plan):
    path = shipped("target")
    full = run_plan({"model": path, "kmax": 1, "n_ctx": 128, "ops": []}, heap="8M")
    one = run_plan({"model": path, "kmax": 1, "n_ctx": 128, "stages": [[0, 1], [2, 3], [4, 5]], "ops": []},
                   heap="8M")
    assert "error" not in one, one
    first, middle, last = one["heap_bytes"]
    layer = 45_056  # int8 weights of one stories260K layer
    assert middle < full["heap_bytes"] / 4 and middle < layer + 25_000  # no embedding, no other layer
    assert first - middle < 1_000  # the embedding stays in the file: one row buffer
    assert last - middle < 8_000  # classifier streamed: a 64-row chunk, a logits row, the final norm


def test_a_stage_refuses_a_slice_outside_the_model(run_plan):
    got = run_plan({"model": shipped("target"), "stages": [[3, 6]], "ops": []})
    assert "not a slice" in got["error"]
