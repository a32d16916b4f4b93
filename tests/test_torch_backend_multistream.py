"""An emulated multi-stream run: 4 virtual drafter boards (real MicroPython VMs, flashed over their ptys)
and one torch verifier whose Batcher serves all four streams at once. Each stream must give the text it
gives when run alone with the same seed, and the concurrent streams must have shared forward passes."""

import threading
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="no PyTorch (the gpu extra): `make test-torch` runs these")

from specmesh.host.backends import SessionParams
from specmesh.host.backends.batcher import Batcher
from specmesh.host.backends.torch_backend import TorchModel, TorchVerifier
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import generate
from specmesh.host.layout import TARGET_FILE
from specmesh.host.provision.cluster import Cluster

pytestmark = pytest.mark.torch

MODELS = Path(__file__).resolve().parent.parent / "models"
STREAMS = 4


@pytest.mark.slow
def test_four_virtual_drafters_one_torch_verifier(tmp_path):
    if not (MODELS / TARGET_FILE).exists():
        pytest.skip("models/target.spm is not built: run `make train`")
    prompts = [[1, 50 + 7 * i, 60, 70 + i] for i in range(STREAMS)]
    params = [SessionParams(seed=10 + i, temperature=0.8, draft_top_k=8) for i in range(STREAMS)]
    batcher = Batcher(TorchModel(MODELS / TARGET_FILE, "cpu"), window_s=0.05)
    clusters = [Cluster(models=MODELS, root=tmp_path / str(i)) for i in range(STREAMS)]
    try:
        drafters = [c.backend("drafter") for c in clusters]

        def run(i, out):
            v = TorchVerifier(batcher, "torch-cpu")
            try:
                out[i] = generate(prompts[i], v, drafters[i], params[i], 20, GammaController(fixed=3)).tokens
            finally:
                v.close()

        alone = [None] * STREAMS
        for i in range(STREAMS):
            run(i, alone)
        passes_alone = batcher.batches
        together = [None] * STREAMS
        threads = [threading.Thread(target=run, args=(i, together)) for i in range(STREAMS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for c in clusters:
            c.close()
        batcher.close()
    assert together == alone and all(len(t) == 20 for t in alone)
    assert len({tuple(t) for t in alone}) == STREAMS  # distinct streams: a leak between them would show
    assert batcher.batches - passes_alone < passes_alone  # the concurrent streams shared passes
