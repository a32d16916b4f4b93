"""The numpy engine (host/backends/engine.py over host/backends/arraymath.py): integer steps against float maths and
against the scalar definitions in shared/intmath.py, batched passes, KV cache, rollback, tables."""

import math

import numpy as np
import pytest

from specmesh.host.backends import arraymath as am
from specmesh.host.backends.engine import EXP_TABLE, Engine, argmax, target_table, to_float
from specmesh.host.backends.modelio import quantize_rows
from specmesh.shared import intmath
from specmesh.shared.modelfile import FLAG_SHARED_CLS, Header, float32_bits
from specmesh.shared.rule import ONE
from specmesh.tools.testmodels import random_model

XP = am.Xp()
Q16 = 1 << 16


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("m") / "m.spm"
    random_model(path, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden=48, vocab=80, max_seq=40, seed=5)
    return path


def q16(x) -> np.ndarray:
    return np.round(np.asarray(x) * Q16).astype(np.int64)


def test_scalar_steps_round_as_defined():
    assert [intmath.rshr(a, 2) for a in (5, 6, -6, -7)] == [1, 2, -1, -2]  # ties up
    assert intmath.rshr(3, -2) == 12 and intmath.mulsh(1000, 3, 4) == 188
    assert [intmath.isqrt(n) for n in (0, 1, 15, 16, 10 ** 12, 2 ** 30 - 1)] == [0, 1, 3, 4, 10 ** 6, 32767]
    assert intmath.bitlen(0) == 0 and intmath.bitlen(255) == 8
    m = intmath.fixed_packed(float32_bits(0.0123))
    assert (m & 0xFFFF) / 2 ** (m >> 16) == pytest.approx(0.0123, rel=1e-4)
    assert intmath.eps_q32(float32_bits(1e-5)) == 42950
    v = [float32_bits(x) for x in (0.5, -3.0, 0.0)]
    s = intmath.fixed_vector(v)
    assert [x / 2 ** s for x in v] == [0.5, -3.0, 0.0]


def test_tables_follow_exp_sigmoid_cos_sin():
    for d in (0, 1, 100, 4095, 4096, 30000, 65535):
        assert intmath.expq(d, EXP_TABLE) == pytest.approx(2 ** 15 * math.exp(-d / 4096), abs=2)
    assert intmath.expq(65536, EXP_TABLE) == 0
    for a in (-20.0, -3.3, -0.01, 0.0, 0.7, 5.0, 20.0):
        assert intmath.sigmoid_q14(int(a * Q16), EXP_TABLE) == pytest.approx(2 ** 14 / (1 + math.exp(-a)), abs=2)
    hd, n = 8, 300
    tab = intmath.rope_table(float32_bits(10000.0), hd, n, [0] * intmath.rope_size(hd, n))
    for p in (0, 1, 31, 32, 77, 299):
        for i in range(hd // 2):
            c, s = intmath.rope_at(tab, hd, p, i)
            ang = p * 10000.0 ** (-2 * i / hd)
            assert (c, s) == pytest.approx((2 ** 14 * math.cos(ang), 2 ** 14 * math.sin(ang)), abs=2)


def test_matvec_tracks_float_and_uses_int16_inputs():
    rng = np.random.default_rng(0)
    w = quantize_rows(rng.normal(size=(7, 300)))
    x = rng.normal(size=(3, 300)) * 4
    got = to_float(am.Mat(w, XP).matvec(q16(x)))
    want = x @ (w.q * w.s[:, None].astype(np.float64)).T
    assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max()
    xq, sh = am.quant(q16(x), 15, XP)
    assert (np.abs(xq).max(-1) >= 1 << 14).all() and np.abs(xq).max() <= 32767  # 15 bits, power-of-two shift
    assert (sh == XP.bitlen(np.abs(q16(x)).max(-1, keepdims=True)) - 15).all()


def test_bitlen_is_int_bit_length_up_to_2_to_the_52():
    edges = [0, 1, 2, 3] + [v for k in range(2, 53) for v in ((1 << k) - 1, 1 << k, (1 << k) + 1)]
    got = XP.bitlen(np.array(edges, np.int64))
    assert got.tolist() == [v.bit_length() for v in edges]
    assert XP.bitlen(np.array([[5, 0], [1 << 40, 7]], np.int64)).tolist() == [[3, 0], [41, 3]]


def test_rmsnorm_and_silu_track_float():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 64)) * np.array([[0.01], [1.0], [30.0], [0.0]])
    w = rng.uniform(0.2, 3.0, size=64).astype(np.float32)
    norm = am.Norm(w, Header(64, 1, 4, 4, 64, 10, 8, norm_eps=1e-5), XP)
    got = to_float(norm(q16(x)))
    want = x * w / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5)
    assert np.abs(got - want).max() <= 2e-3 * np.abs(want).max()
    assert not got[3].any()
    a, b = rng.normal(size=(2, 50)) * 4, rng.normal(size=(2, 50)) * 3
    got = to_float(am.silu(q16(a), q16(b), XP.asarray(EXP_TABLE), XP))
    assert np.abs(got - a / (1 + np.exp(-a)) * b).max() <= 2e-3 * np.abs(b).max() * np.abs(a).max()


def test_integer_attention_is_softmax_attention_on_the_int8_cache():
    rng = np.random.default_rng(3)
    n_kv, k, group, hd, n = 2, 3, 2, 16, 9
    q = rng.normal(size=(n_kv, k, group, hd)) * 3
    q[0, 1, 1] = 0.0  # a zero query head attends uniformly
    kq, ke = am.quant(q16(rng.normal(size=(n, n_kv * hd))), 7, XP)
    vq, ve = am.quant(q16(rng.normal(size=(n, n_kv * hd)) * np.arange(1, n + 1)[:, None]), 7, XP)
    kq, vq = kq.reshape(n, n_kv, hd).transpose(1, 0, 2), vq.reshape(n, n_kv, hd).transpose(1, 0, 2)
    visible = np.arange(n)[None, :] <= np.arange(n - k, n)[:, None]
    got = to_float(am.attention(q16(q), kq, ke[:, 0], vq, ve[:, 0], visible,
                                intmath.isqrt((1 << 28) // hd), XP.asarray(EXP_TABLE), XP))
    keys = kq * 2.0 ** (ke[:, 0] - 16)[None, :, None]
    vals = vq * 2.0 ** (ve[:, 0] - 16)[None, :, None]
    score = np.einsum("hjgd,htd->hjgt", q, keys) / np.sqrt(hd)
    score = np.where(visible[:, None], score, -np.inf)
    p = np.exp(score - score.max(-1, keepdims=True))
    want = np.einsum("hjgt,htd->hjgd", p / p.sum(-1, keepdims=True), vals)
    assert np.abs(got - want).max() <= 2e-3 * np.abs(want).max()


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
    assert argmax(np.array([5, 20, -1, 20])) == 1


def test_a_nan_logit_is_an_error_as_in_shared_rule():
    for row in ([1.0, np.nan, 0.5], [np.nan, 1.0], [-1.0, 0.5, -np.nan]):
        with pytest.raises(ValueError, match="NaN logit"):
            argmax(np.array(row, np.float32))
    assert argmax(np.array([1.0, np.inf, np.inf], np.float32)) == 1


def test_context_depends_on_earlier_tokens(model_path):
    a = Engine(model_path).forward([5, 6, 7])[-1]
    b = Engine(model_path).forward([50, 6, 7])[-1]
    assert np.abs(a - b).max() > 0


def test_shared_classifier(tmp_path):
    path = tmp_path / "s.spm"
    random_model(path, flags=FLAG_SHARED_CLS, seed=2)
    e = Engine(path)
    logits = e.forward([1, 2])
    assert logits.shape == (2, 96) and logits.dtype == np.int64
    assert e.model.cls is e.model.tok_emb


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
    greedy = target_table(row, 0)
    assert greedy[argmax(row)] == ONE and sum(greedy) == ONE
    full = target_table(row, 1000)
    assert sum(full) == ONE and min(full) >= 0 and full.index(max(full)) == argmax(row)
    top3 = target_table(row, 800, top_k=3)
    assert sum(top3) == ONE and sum(1 for w in top3 if w) == 3
