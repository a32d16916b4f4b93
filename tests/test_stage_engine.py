"""Pipeline stages of the firmware engine (layers [a, b) each) under the real micropython binary.

A chain of stages, each handing its residual stream to the next exactly, gives the full model's logits
bit for bit: compared with the numpy engine (host/backends/arraymath.py) on held-out text of the shipped target,
for several splits, one and several positions per pass, and a greedy continuation. docs/pipeline.md.
"""

import numpy as np
import pytest

from tests.test_firmware_engine import reference
from tests.test_firmware_engine_shipped import REF, chunks, shipped

SPLITS = [[[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]], [[0, 2], [2, 5]], [[0, 5]]]


@pytest.mark.parametrize("stages,hold", [(s, False) for s in SPLITS] + [(SPLITS[0], True), (SPLITS[1], True)],
                         ids=["5x1", "2+3", "1x5", "5x1-cls-held", "2+3-cls-held"])
def test_stage_chain_gives_the_full_models_logits(run_plan, stages, hold):
    """With the classifier streamed from the file every pass, or held in the last stage's heap: the same
    integers (hold: a 16 KB reserve, a node's, leaves room for it in 64 MB)."""
    path = shipped("target")
    doc = np.load(REF)["target.tokens"][0][:40]
    ops = chunks(doc, 3) + [["greedy", 12]]
    plan = {"model": path, "kmax": 3, "stages": stages, "ops": ops}
    got = run_plan(dict(plan, hold_cls=16384) if hold else plan, heap="64M")
    assert "error" not in got, got
    assert got["cls_held"] is hold
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


def test_the_last_stage_holds_the_classifier_only_where_its_reserve_stays_free(run_plan):
    """A heap with the classifier's 34 KB free beyond the reserve holds it (and grows by that much); a
    reserve it would eat into keeps it streamed, with the same logits."""
    path = shipped("target")
    doc = [int(t) for t in np.load(REF)["target.tokens"][0][:6]]
    ops = [["fwd", doc, 0]]
    base = {"model": path, "kmax": 1, "n_ctx": 128, "stages": [[4, 5]], "ops": []}
    # this VM's heap also holds the engine's source code: 140 KB leave ~40 KB free after load, as a classic
    # ESP32 (19 KB) too little for the classifier beside the reserve
    streamed = run_plan(dict(base, hold_cls=16384), heap="140k")
    held = run_plan(dict(base, hold_cls=16384), heap="256k")
    assert "error" not in streamed and "error" not in held, (streamed, held)
    assert streamed["cls_held"] is False and held["cls_held"] is True
    assert 16384 <= held["mem_free"] < 256 * 1024 - 140 * 1024 + streamed["mem_free"] - 34_000  # it took the 34 KB
    full = {"model": path, "kmax": 6, "stages": [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]], "ops": ops}
    a = run_plan(dict(full, hold_cls=16384), heap="8M")
    b = run_plan(dict(full, hold_cls=8 << 20), heap="8M")  # a reserve as large as the heap: streamed
    assert a["cls_held"] is True and b["cls_held"] is False
    assert a["results"][0]["logits"] == b["results"][0]["logits"]
