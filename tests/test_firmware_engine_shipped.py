"""The shipped models (models/drafter.spm, models/target.spm) in the firmware engine, against the numpy oracle.

On the held-out text of models/reference.npz: teacher-forced logits the same as the numpy engine's
(the comparison and its tolerance are tests/test_firmware_engine.py's) with the same argmax on every
row, with the native kernels a node picks and with the viper kernels (the plain-Python ones are checked
against both on random models: tests/test_firmware_engine.py), and the same greedy continuation of every
held-out prompt, token for token, near-ties included.
The target runs in an 8 MB heap (an ESP32-S3 with 8 MB PSRAM). The drafter's budget, a classic ESP32's
112,000-byte heap with the node's code frozen, is tests/test_firmware_budget.py's: it runs the whole node.
"""

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.test_firmware_engine import KERNELS, assert_same_logits, reference

MODELS = ROOT / "models"
REF = MODELS / "reference.npz"
NEW = 24
KMAX = {"drafter": 1, "target": 8}  # a drafter runs one position per pass, a verifier gamma + 1
HEAPS = {"drafter": "256k", "target": "8M"}  # correctness runs; the drafter's budget: test_firmware_budget


def shipped(name: str) -> str:
    path = MODELS / (name + ".spm")
    if not path.exists() or not REF.exists():
        pytest.skip("models/%s.spm or models/reference.npz is not shipped yet (make train)" % name)
    return str(path)


def chunks(tokens, kmax, op="fwd"):
    return [[op, [int(t) for t in tokens[i:i + kmax]], i] for i in range(0, len(tokens), kmax)]


@pytest.mark.parametrize("kernels", ["native", "viper"])
@pytest.mark.parametrize("name", ["drafter", "target"])
def test_teacher_forced_logits_match_reference(run_plan, name, kernels):
    path = shipped(name)
    for doc in np.load(REF)[name + ".tokens"]:
        ops = chunks(doc, KMAX[name])
        plan = {"model": path, "kmax": KMAX[name], "ops": ops, **KERNELS[kernels]}
        got = run_plan(plan, heap="64M")  # room for the JSON
        assert "error" not in got, got
        assert got["kernels"] == kernels
        want = reference(path, ops)
        assert_same_logits([row for g in got["results"] for row in g["logits"]],
                           np.concatenate([w["logits"] for w in want]))
        assert [g["argmax"] for g in got["results"]] == [w["argmax"] for w in want]


@pytest.mark.parametrize("name", ["drafter", "target"])
def test_greedy_continuations_match_reference(run_plan, name):
    path = shipped(name)
    prompts = np.load(REF)[name + ".prompt"]
    ops = []
    for p in prompts:
        ops += chunks(p, KMAX[name], "feed") + [["greedy", NEW], ["rollback", 0]]
    got = run_plan({"model": path, "kmax": KMAX[name], "ops": ops}, heap=HEAPS[name])
    assert "error" not in got, got
    greedy_got = [r["tokens"] for r in got["results"] if "tokens" in r]
    greedy_want = [r["tokens"] for r in reference(path, ops) if "tokens" in r]
    assert len(greedy_got) == len(prompts) and all(len(t) == NEW for t in greedy_got)
    assert greedy_got == greedy_want


def test_golden_continuation_through_the_firmware_engine(run_plan):
    """llama2.c's published greedy continuation of "Once upon a time" by stories260K, on the board engine."""
    from specmesh.host.decode.tokenizer import Tokenizer
    from tests.test_models import GOLDEN

    tok = Tokenizer.from_llama2c(MODELS / "tokenizer.bin")
    got = run_plan({"model": shipped("target"), "kmax": KMAX["target"],
                    "ops": [["feed", tok.encode("Once upon a time"), 0], ["greedy", 40]]}, heap=HEAPS["target"])
    assert "error" not in got, got
    assert tok.decode(got["results"][-1]["tokens"]) == GOLDEN
