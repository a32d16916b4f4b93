"""The torch verifier (host/backends/torch_backend.py, host/backends/batcher.py) against the numpy reference engine.

Parity: the logits are bit-identical to host/backends/engine.py's on the CPU and on CUDA (`-m gpu`): both are
host/backends/arraymath.py's integer arithmetic (docs/CONTRACTS.md section 4), exact in any summation order,
so greedy tokens are identical too.
"""

import json
import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="no PyTorch (the gpu extra): `make test-torch` runs these")

from specmesh.host.backends import BackendError, LocalDrafter, LocalVerifier, SessionParams
from specmesh.host.backends.arraymath import Mat, Xp
from specmesh.host.backends.batcher import Batcher
from specmesh.host.backends.engine import Engine
from specmesh.host.backends.modelio import quantize_rows
from specmesh.host.backends.torch_backend import TorchModel, TorchVerifier, TorchXp
from specmesh.host.cli.registry import VERIFIERS
from specmesh.host.cli.run import cli
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import generate
from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.shared.modelfile import FLAG_SHARED_CLS
from specmesh.tools.testmodels import random_model

pytestmark = pytest.mark.torch

VOCAB = 64
CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device here: the gpu tests run on a CUDA machine")])
DEVICES = ["cpu", CUDA]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    target, tied, drafter = d / TARGET_FILE, d / "tied.spm", d / DRAFTER_FILE
    random_model(target, dim=32, n_layers=2, hidden=64, vocab=VOCAB, max_seq=96, seed=11)
    random_model(tied, dim=32, n_layers=2, hidden=64, vocab=VOCAB, max_seq=96, seed=13, flags=FLAG_SHARED_CLS)
    random_model(drafter, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, vocab=VOCAB, max_seq=96,
                 seed=12)
    return {"target": str(target), "tied": str(tied), "drafter": str(drafter)}


def assert_parity(got, want, device):
    assert got.dtype == want.dtype == np.int64, device
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("device", DEVICES)
def test_integer_matvec_is_bit_exact(device):
    rng = np.random.default_rng(0)
    for cols in (40, 516):  # 516: the widest the firmware accepts, sums near 2^31
        w = quantize_rows(rng.normal(size=(24, cols)))
        x = (rng.normal(size=(5, cols)) * 65536).astype(np.int64)
        x[2] = 0  # an all-zero row quantizes to zeros
        x[3] = 32767 << 10  # every input at its int16 maximum
        x[4] *= 1000  # large activations: a large shift
        tx = TorchXp(device)
        got = Mat(w, tx).matvec(tx.asarray(x)).cpu().numpy()
        np.testing.assert_array_equal(got, Mat(w, Xp()).matvec(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("which", ["target", "tied"])
def test_logits_match_the_numpy_engine_over_ragged_calls(models, which, device):
    toks = np.random.default_rng(1).integers(0, VOCAB, 90).tolist()
    ref, model = Engine(models[which]), TorchModel(models[which], device)
    s = model.open_stream()
    for a, b in ((0, 1), (1, 40), (40, 45), (45, 90)):
        assert_parity(model.forward([(s, toks[a:b])])[0], ref.forward(toks[a:b]), device)
    ref.rollback(44)
    model.rollback(s, 44)  # re-verify after a rejection: same as never having seen the rest
    assert_parity(model.forward([(s, toks[50:55])])[0], ref.forward(toks[50:55]), device)


@pytest.mark.parametrize("device", DEVICES)
def test_batched_streams_equal_each_stream_alone(models, device):
    rng = np.random.default_rng(2)
    prefixes = [rng.integers(0, VOCAB, n).tolist() for n in (1, 30, 7, 60, 12)]
    runs = [rng.integers(0, VOCAB, n).tolist() for n in (5, 5, 1, 3, 5)]
    together, alone = TorchModel(models["target"], device, streams=2), TorchModel(models["target"], device)
    slots = [together.open_stream() for _ in prefixes]  # grows the pool past its 2 initial slots
    together.forward(list(zip(slots, prefixes)))
    batched = together.forward(list(zip(slots, runs)))
    for p, r, got in zip(prefixes, runs, batched):
        s = alone.open_stream()
        alone.forward([(s, p)])
        assert_parity(got, alone.forward([(s, r)])[0], device)
        alone.close_stream(s)
    assert [together.length(s) for s in slots] == [len(p) + len(r) for p, r in zip(prefixes, runs)]


def test_forward_refuses_bad_runs_without_touching_any_cache(models):
    model = TorchModel(models["target"], "cpu")
    a, b = model.open_stream(), model.open_stream()
    model.forward([(a, [1, 2, 3])])
    for runs, msg in [([(a, [1]), (b, [VOCAB])], "out of range"), ([(a, [1]), (a, [2])], "one run per stream"),
                      ([(b, [])], "at least one token"), ([(a, [0] * 94)], "context of 96"),
                      ([(7, [1])], "not open")]:
        with pytest.raises(ValueError, match=msg):
            model.forward(runs)
    assert (model.length(a), model.length(b)) == (3, 0)


def test_batcher_runs_one_pass_for_waiting_streams_and_fails_only_a_bad_request(models):
    batcher = Batcher(TorchModel(models["target"], "cpu"), window_s=5.0)
    try:
        slots = [batcher.open_stream() for _ in range(4)]
        futs = [batcher.submit(s, [s + 1, 2]) for s in slots[:3]]
        assert not any(f.done() for f in futs)  # a fourth stream is open and not waiting yet
        bad = batcher.submit(slots[3], [VOCAB + 5])
        with pytest.raises(ValueError, match="out of range"):
            bad.result(timeout=30)
        assert [f.result(timeout=30).shape for f in futs] == [(2, VOCAB)] * 3
        assert batcher.requests == 3 and batcher.batches == 3  # the good ones were re-run one by one
        batcher.submit(slots[0], [1])
        with pytest.raises(ValueError, match="pending"):
            batcher.submit(slots[0], [1])
    finally:
        batcher.close()


def prompts(n, seed=5):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, rng.integers(1, 9)).tolist() for _ in range(n)]


def test_greedy_text_identical_to_the_numpy_verifier(models):
    ref = LocalVerifier(models["target"])
    torch_v = VERIFIERS["torch-cpu"](models["target"])
    drafter = LocalDrafter(models["drafter"])
    params = SessionParams(temperature=0.0)
    try:
        for i, prompt in enumerate(prompts(8)):
            want = generate(prompt, ref, None, params, 30).tokens
            assert generate(prompt, torch_v, None, params, 30).tokens == want, "plain, prompt %d" % i
            spec = generate(prompt, torch_v, drafter, params, 30, GammaController(fixed=1 + i % 5))
            assert spec.tokens == want, "speculative, prompt %d" % i
    finally:
        torch_v.close()


def test_four_streams_on_one_verifier_each_give_their_text_alone(models):
    params = [SessionParams(seed=s, temperature=0.8, draft_top_k=6) for s in (1, 2, 3, 1)]
    starts = prompts(4, seed=8)
    batcher = Batcher(TorchModel(models["target"], "cpu"), window_s=0.05)

    def run(i, out):
        v = TorchVerifier(batcher, "torch-cpu")
        out[i] = generate(starts[i], v, LocalDrafter(models["drafter"]), params[i], 24,
                          GammaController(fixed=3)).tokens
        v.close()

    try:
        alone = [None] * 4
        for i in range(4):
            run(i, alone)
        single = batcher.batches
        together = [None] * 4
        threads = [threading.Thread(target=run, args=(i, together)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        batcher.close()
    assert together == alone and all(len(t) == 24 for t in alone)
    assert len({tuple(t) for t in alone}) == 4  # streams differ, so a leak between them would show
    assert batcher.batches - single < single  # the concurrent streams shared passes


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_gpu_verifier_refuses_without_cuda(models):
    with pytest.raises(BackendError, match="needs CUDA.*--verifier torch-cpu"):
        VERIFIERS["gpu"](models["target"])


SHIPPED = Path(__file__).resolve().parent.parent / "models"


@pytest.fixture(scope="module")
def shipped():
    if not (SHIPPED / TARGET_FILE).exists():
        pytest.skip("models/target.spm is not built: run `make train`")
    return np.load(SHIPPED / "reference.npz")


@pytest.mark.parametrize("name", ["drafter", "target"])
def test_shipped_model_logits_are_the_numpy_engines(shipped, name):
    ref, model = Engine(SHIPPED / (name + ".spm")), TorchModel(SHIPPED / (name + ".spm"), "cpu")
    s = model.open_stream()
    for toks in shipped[name + ".tokens"].tolist():
        ref.reset()
        model.rollback(s, 0)
        for i in range(0, len(toks), 5):  # verify-sized runs
            assert_parity(model.forward([(s, toks[i:i + 5])])[0], ref.forward(toks[i:i + 5]), "cpu")


def test_shipped_models_greedy_text_via_cli_equals_the_cpu_verifier(shipped, tmp_path, capsys):
    def run(*args):
        out = tmp_path / "stats.json"
        assert cli(["--drafter", "cpu", "--max-tokens", "32", "--quiet", "--stats-json", str(out), *args]) == 0
        return json.loads(out.read_text())["token_ids"]

    for prompt in ("Once upon a time", "The little dog"):
        want = run("--verifier", "cpu", "--plain", "--prompt", prompt)
        assert run("--verifier", "torch-cpu", "--plain", "--prompt", prompt) == want
        assert run("--verifier", "torch-cpu", "--gamma", "4", "--prompt", prompt) == want
        assert len(set(want)) > 3  # real text, not one token repeated
    if not torch.cuda.is_available():
        capsys.readouterr()
        assert cli(["--verifier", "gpu", "--drafter", "cpu", "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("specmesh run: error: the gpu verifier needs CUDA") and "\n" not in err
