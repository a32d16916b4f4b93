"""The numpy reference engine (host/engine.py): int8 arithmetic, batched passes, KV cache, rollback."""

import numpy as np
import pytest

from host.engine import Engine, Mat, argmax, attention, quantize_act, target_table
from host.modelio import quantize_rows
from shared.modelfile import FLAG_SHARED_CLS
from shared.rule import ONE
from tools.testmodels import random_model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "m.spm"
    random_model(path, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden=48, vocab=80, max_seq=40, seed=5)
    return path


def test_quantize_act_and_matvec_are_the_contract():
    x = np.array([[0.5, -1.27, 0.015, 0.0], [0, 0, 0, 0]], dtype=np.float32)
    xq, xs = quantize_act(x)
    np.testing.assert_array_equal(xq[0], [50, -127, 2, 0])  # floor(x/xs + 0.5): 1.5 -> 2
    assert xs[1] == 0 and not xq[1].any()
    rng = np.random.default_rng(0)
    w = quantize_rows(rng.normal(size=(7, 300)))
    xr = rng.normal(size=(3, 300)).astype(np.float32)
    xq, xs = quantize_act(xr)
    acc = xq.astype(np.int64) @ w.q.astype(np.int64).T  # exact int reference
    np.testing.assert_allclose(Mat(w).matvec(xr), acc * w.s[None, :] * xs[:, None], rtol=1e-6)


def test_integer_attention_is_float_attention_at_float32_precision():
    """The firmware's integer attention against softmax(q.k / sqrt(hd)) v in float64 on the same int8 cache."""
    rng = np.random.default_rng(3)
    n_kv, k, group, hd, n = 2, 3, 2, 16, 9
    q = (rng.normal(size=(n_kv, k, group, hd)) * 3).astype(np.float32)
    q[0, 1, 1] = 0.0  # a zero query head attends uniformly
    kq, ks = quantize_act(rng.normal(size=(n_kv, n, hd)).astype(np.float32))
    vq, vs = quantize_act(rng.normal(size=(n_kv, n, hd)).astype(np.float32))
    ks, vs = ks[0], vs[1]  # one scale per position, shared by the kv heads (as the cache holds them)
    vq[:, 4] = 0  # an all-zero value row: scale 0
    vs[4] = 0.0
    visible = np.arange(n)[None, :] <= np.arange(n - k, n)[:, None]
    got = attention(q, kq, ks, vq, vs, visible)
    keys, vals = kq * ks[:, None].astype(np.float64), vq * vs[:, None].astype(np.float64)
    score = np.einsum("hjgd,htd->hjgt", q.astype(np.float64), keys) / np.sqrt(hd)
    p = np.exp(np.where(visible[:, None], score, -np.inf) - score.max(-1, keepdims=True))
    want = np.einsum("hjgt,htd->hjgd", p / p.sum(-1, keepdims=True), vals)
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.abs(got - want).max() <= 1e-6 * np.abs(want).max()
    np.testing.assert_array_equal(attention(q[:, :1], kq, ks, vq, vs, visible[:1]), got[:, :1])


def test_batched_pass_equals_single_steps(model_path):
    toks = [3, 17, 42, 8, 79, 0, 55, 21]
    batched = Engine(model_path)
    single = Engine(model_path)
    a = batched.forward(toks[:3])
    b = batched.forward(toks[3:])
    rows = np.concatenate([a, b])
    for j, t in enumerate(toks):
        np.testing.assert_array_equal(single.forward([t], j)[0], rows[j])
    assert batched.length == single.length == len(toks)


def test_rollback_forgets_positions(model_path):
    e = Engine(model_path)
    e.forward([1, 2, 3, 4])
    e.rollback(2)
    assert e.length == 2
    after = e.forward([9, 10])
    fresh = Engine(model_path).forward([1, 2, 9, 10])[2:]
    np.testing.assert_array_equal(after, fresh)
    again = e.forward([11], 1)  # an earlier start position rolls back implicitly
    np.testing.assert_array_equal(again, Engine(model_path).forward([1, 11])[1:])
    e.reset()
    np.testing.assert_array_equal(e.forward([1]), Engine(model_path).forward([1]))


def test_argmax_ties_go_to_lowest_id():
    assert argmax(np.array([0.5, 2.0, -1.0, 2.0], dtype=np.float32)) == 1


def test_a_nan_logit_is_an_error_as_in_shared_rule():
    for row in ([1.0, np.nan, 0.5], [np.nan, 1.0], [-1.0, 0.5, -np.nan]):
        with pytest.raises(ValueError, match="NaN logit"):
            argmax(np.array(row, np.float32))
    assert argmax(np.array([1.0, np.inf, np.inf], np.float32)) == 1


def test_context_depends_on_earlier_tokens(model_path):
    a = Engine(model_path).forward([5, 6, 7])[-1]
    b = Engine(model_path).forward([50, 6, 7])[-1]
    assert np.abs(a - b).max() > 1e-3


def test_shared_classifier(tmp_path):
    path = tmp_path / "s.spm"
    random_model(path, flags=FLAG_SHARED_CLS, seed=2)
    e = Engine(path)
    logits = e.forward([1, 2])
    assert logits.shape == (2, 96)
    assert e.cls.q is e.tok_emb.q


@pytest.mark.parametrize("call, message", [
    (lambda e: e.forward([]), "at least one"),
    (lambda e: e.forward([1], 3), "beyond"),
    (lambda e: e.forward([80]), "out of range"),
    (lambda e: e.forward(list(range(41))), "context"),
    (lambda e: e.rollback(-1), ">= 0"),
])
def test_bad_calls(model_path, call, message):
    with pytest.raises(ValueError, match=message):
        call(Engine(model_path))


def test_target_table_is_a_quantized_distribution(model_path):
    row = Engine(model_path).forward([4, 9])[-1]
    greedy = target_table(row, 0.0)
    assert greedy[argmax(row)] == ONE and sum(greedy) == ONE
    full = target_table(row, 1.0)
    assert sum(full) == ONE and min(full) >= 0 and full.index(max(full)) == argmax(row)
    top3 = target_table(row, 0.8, top_k=3)
    assert sum(top3) == ONE and sum(1 for w in top3 if w) == 3
