"""The PyTorch model definition and the exporter agree with the numpy int8 engine (needs torch: slow)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="no PyTorch (the gpu extra): `make test-torch` runs these")

from specmesh.host.backends.engine import Engine, to_float
from specmesh.tools.export import export_model
from specmesh.tools.modeldefs import ModelArgs, Transformer

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.mark.parametrize("shared", [True, False])
def test_exported_model_tracks_torch(tmp_path, shared):
    torch.manual_seed(0)
    a = ModelArgs(dim=48, n_layers=2, n_heads=6, n_kv_heads=2, hidden=96, vocab=80, max_seq=40, shared_cls=shared)
    m = Transformer(a).eval()
    with torch.no_grad():  # larger weights than the init so logits spread and a wrong RoPE/GQA shows
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0, p.shape[1] ** -0.5)
    h = export_model(m, tmp_path / "m.spm", tokenizer_id=7)
    assert h.tokenizer_id == 7
    toks = torch.randint(0, a.vocab, (1, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = m(toks)[0].numpy()
    eng = Engine(tmp_path / "m.spm")
    got = to_float(eng.forward(toks[0].tolist(), 0))
    span = want.max(axis=1) - want.min(axis=1)
    assert (np.abs(got - want).max(axis=1) < 0.04 * span).all()
    assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() > 0.9
    # the same tokens one at a time through the KV cache give the batched logits
    eng.reset()
    steps = np.stack([eng.forward([t], i)[0] for i, t in enumerate(toks[0].tolist())])
    np.testing.assert_array_equal(to_float(steps), got)
