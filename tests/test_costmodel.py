"""host/projection/costmodel.py follows firmware/engine.py: every kernel call a real forward pass makes, with its
shapes, priced by the cost model's own per-kernel counts (viper's and the native kernels'), adds up to
what pass_work counts from the model header alone, for one position and for a 5-position verify; and
where a board keeps a model follows its heap."""

import json
import subprocess
from pathlib import Path

import pytest

from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE, micropython_binary
from specmesh.host.projection import costmodel as cm
from specmesh.shared.modelfile import HEADER_SIZE, parse_header

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = """
import sys
sys.path[:0] = ["firmware", "."]
import json, refkernels as K
from engine import Engine
log = []
def wrap(name):
    f = getattr(K, name)
    def g(*a):
        log.append((name, list(a[-1][:12])))
        return f(*a)
    setattr(K, name, g)
for n in ("matmul", "quant", "requant", "embed", "rmsnorm", "rope", "attend", "silu", "argmax"):
    wrap(n)
e = Engine("models/target.spm", 5, viper=False)
e.forward([1, 2, 3, 4, 5, 6, 7, 8][:5], 0)
e.forward([9, 10, 11], 5)
out = {}
for k, pos in ((1, 8), (5, 8)):
    del log[:]
    e.forward([3, 4, 5, 6, 7][:k], pos)
    for j in range(k):
        e.argmax(j)
    out[k] = log[:]
    e.rollback(pos)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def calls():
    exe = micropython_binary()
    assert exe, "the micropython binary is missing: run `make setup`"
    p = subprocess.run([exe, "-X", "heapsize=8M", "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def priced(h, log, K):
    """The kernel set K's counts applied to each recorded call (p: its parameter array)."""
    w = cm.Work()
    for name, p in log:
        if name == "matmul":
            K.matmul(w, p[0], p[1], p[2])
        elif name == "quant":
            K.quant(w, p[5], p[1])
        elif name == "requant":
            K.requant(w, p[0], p[1], "residual" if p[5] else "requant")
        elif name == "rmsnorm":
            K.rmsnorm(w, p[0], p[1])
        elif name == "rope":
            K.rope(w, h, p[1], p[0])
        elif name == "attend":
            K.attend(w, h, p[8], p[0] + p[8] - 1)
        elif name == "silu":
            K.silu(w, p[0], p[1])
        elif name == "embed":
            K.embed(w, p[0])
        elif name == "argmax":
            K.argmax(w, p[1])
        w.add("engine", 1)
    return w


@pytest.mark.parametrize("kernels", sorted(cm.KERNELS))
@pytest.mark.parametrize("k", [1, 5])
def test_pass_work_is_what_the_engine_calls(calls, k, kernels):
    h = parse_header((ROOT / "models" / TARGET_FILE).read_bytes()[:HEADER_SIZE])
    K = cm.KERNELS[kernels]
    want = priced(h, calls[str(k)], K)
    # the native module's `layer` kernel runs a layer's 26 steps (the calls logged) in one call
    want["engine"] -= (cm.VIPER.calls_per_layer - K.calls_per_layer) * h.n_layers
    got = cm.pass_work(h, k, 8 + k, kernels=K)
    assert set(got) == set(want) | {"weights_psram", "kv_psram"}  # the target lives in PSRAM
    for term, amount in want.items():
        assert got[term] == pytest.approx(amount), term
    assert got["weights_psram"] == cm.weight_bytes(h) > cm.SRAM_BUDGET


def test_a_pipeline_stage_counts_only_its_layers():
    h = parse_header((ROOT / "models" / TARGET_FILE).read_bytes()[:HEADER_SIZE])
    first, last = cm.pass_work(h, 5, 20, (0, 2), False), cm.pass_work(h, 5, 20, (2, h.n_layers), True)
    whole = cm.pass_work(h, 5, 20)
    for term in cm.COMPUTE + ("engine",):
        assert first.get(term, 0) + last.get(term, 0) == pytest.approx(whole.get(term, 0)), term
    assert "weights_psram" not in first  # two layers are 70 KB: that board keeps them in SRAM


def test_native_matmul_costs_less_per_mac_with_more_positions_per_weight_load():
    h = parse_header((ROOT / "models" / TARGET_FILE).read_bytes()[:HEADER_SIZE])
    one, five = cm.pass_work(h, 1, 20, kernels=cm.NATIVE), cm.pass_work(h, 5, 24, kernels=cm.NATIVE)
    assert five["matmul_5"] < 5 * one["matmul_1"]
    assert five["weights_psram"] == one["weights_psram"] == cm.weight_bytes(h)  # one stream per pass, any k


def test_a_model_the_heap_holds_is_not_read_from_romfs():
    from specmesh.host.boardclasses import ESP32, ESP32S3, heap_need, on_romfs

    small = parse_header((ROOT / "models" / "drafter-esp32.spm").read_bytes()[:HEADER_SIZE])
    big = parse_header((ROOT / "models" / DRAFTER_FILE).read_bytes()[:HEADER_SIZE])
    assert heap_need(small) <= ESP32.heap_bytes < heap_need(big)
    assert not on_romfs(small, ESP32) and on_romfs(big, ESP32)
    assert not on_romfs(big, ESP32S3)  # PSRAM
    assert not on_romfs(big, ESP32, (0, 1))  # a stage's slice sits in the heap
