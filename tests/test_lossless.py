"""Losslessness of shared/rule.py, statistically: emitted tokens follow the target, a wrong rule does not.

Each configuration draws context-free target tables p[0..γ] and drafter q-hat tables (top-k of a
perturbed p), then runs many independent rounds (one seed each): drafts sampled from q-hat, verdict
from rule.verify. Tokens emitted at offset j must be distributed as p[j] (given the round got that
far), whatever q-hat is. Check: Pearson chi-square goodness of fit per (configuration, offset), cells
with expected count < 5 pooled, against the chi-square quantile at significance 1e-6 (Wilson-Hilferty);
any emission of a p = 0 token fails outright. The rounds are seeded, so the test is deterministic.
The same check must reject two planted wrong rules: the residual replaced by p, and an accept test
that always passes. The simulation loop is tests/mp_runner.py's `simulate`; a smaller run under
MicroPython must give the very same counts as CPython.
"""

import importlib.util
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from specmesh.shared import prng, rule
from specmesh.shared.rule import ONE

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("mp_runner", ROOT / "tests" / "mp_runner.py")
runner = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(runner)

ALPHA_Z = 4.7534  # standard normal quantile for 1 - 1e-6
# (vocab, gamma, draft top-k, rounds): 5 configurations, 110 000 rounds, ~250 000 emitted tokens
CONFIGS = [(10, 1, 10, 20000), (16, 2, 4, 20000), (24, 3, 8, 20000), (32, 4, 8, 25000), (32, 4, 32, 25000)]


def chi2_bound(df):
    """Chi-square quantile at 1 - 1e-6 (Wilson-Hilferty approximation)."""
    c = 2.0 / (9.0 * df)
    return df * (1.0 - c + ALPHA_Z * math.sqrt(c)) ** 3


def goodness(counts, p):
    """(chi-square, bound, total variation) of integer counts against the integer table p."""
    counts = np.asarray(counts, dtype=float)
    n = counts.sum()
    probs = np.asarray(p, dtype=float) / ONE
    if np.any(counts[probs == 0]):
        return math.inf, 0.0, 1.0
    exp = probs * n
    big = exp >= 5
    obs_cells = list(counts[big]) + ([counts[~big & (probs > 0)].sum()] if np.any(~big & (probs > 0)) else [])
    exp_cells = list(exp[big]) + ([exp[~big & (probs > 0)].sum()] if np.any(~big & (probs > 0)) else [])
    obs_cells, exp_cells = np.array(obs_cells), np.array(exp_cells)
    stat = float(((obs_cells - exp_cells) ** 2 / exp_cells).sum())
    return stat, chi2_bound(max(len(exp_cells) - 1, 1)), float(np.abs(counts / n - probs).sum() / 2)


def make_config(vocab, gamma, k, rng):
    """Target tables (with zeros) and the drafter's q-hat tables: top-k of p mixed with noise."""
    p_float = [rng.dirichlet(np.full(vocab, 0.7)) for _ in range(gamma + 1)]
    for pf in p_float:
        pf[rng.choice(vocab, vocab // 5, replace=False)] = 0.0
    p = [rule.quantize((pf * 1e9).astype(np.int64).tolist()) for pf in p_float]
    q = []
    for pf in p_float[:gamma]:
        qf = 0.6 * pf + 0.4 * rng.dirichlet(np.ones(vocab))
        ids, w = rule.quantize_topk((qf * 1e9).astype(np.int64).tolist(), k)
        q.append([ids, w])
    return p, q


def check(counts, p, min_count=500):
    """Per offset: (stat, bound, tv, n); offsets reached fewer than min_count times are skipped."""
    out = []
    for j, c in enumerate(counts):
        if sum(c) >= min_count:
            stat, bound, tv = goodness(c, p[j])
            out.append((stat, bound, tv, sum(c)))
    return out


@pytest.fixture(scope="module")
def configs():
    rng = np.random.default_rng(12345)
    return [make_config(v, g, k, rng) + (runs,) for v, g, k, runs in CONFIGS]


def run_all(configs):
    results = []
    for i, (p, q, runs) in enumerate(configs):
        results.append(check(runner.simulate(p, q, 1000 * 1000 * i, runs), p))
    return results


def test_real_rule_is_lossless(configs):
    results = run_all(configs)
    draws = sum(r[3] for res in results for r in res)
    assert draws >= 100_000
    for (v, g, k, _), res in zip(CONFIGS, results):
        assert res[0][3] > 0  # the first emitted token always exists
        for j, (stat, bound, tv, n) in enumerate(res):
            assert stat < bound, "vocab %d gamma %d k %d offset %d: chi2 %.1f >= %.1f (tv %.4f, n %d)" % (
                v, g, k, j, stat, bound, tv, n)


def _worst(results):
    return max(stat / bound for res in results for stat, bound, _, _ in res)


def test_residual_replaced_by_p_fails(configs, monkeypatch):
    monkeypatch.setattr(rule, "sample_residual", lambda p, ids, w, seed, pos: rule.sample(p, seed, pos, prng.EMIT))
    assert _worst(run_all(configs)) > 1.0


def test_accept_always_fails(configs, monkeypatch):
    real = rule.uniform
    monkeypatch.setattr(rule, "uniform",
                        lambda s, pos, purpose, n: 0 if purpose == prng.ACCEPT else real(s, pos, purpose, n))
    assert _worst(run_all(configs)) > 1.0


def test_micropython_gives_the_same_counts(micropython, tmp_path, configs):
    p, q, _ = configs[3]  # vocab 32, gamma 4
    case = {"name": "simulate", "op": "simulate", "args": {"p": p, "q": q, "seed0": 7, "runs": 1500, "pos0": 50}}
    path = tmp_path / "simulate.json"
    path.write_text('{"cases": [\n' + json.dumps(case) + "\n]}\n")
    res = subprocess.run([micropython, str(ROOT / "tests" / "mp_runner.py"), str(path)], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    name, counts = json.loads(res.stdout)
    assert counts == runner.simulate(p, q, 7, 1500, 50)
    for stat, bound, tv, n in check(counts, p, min_count=200):
        assert stat < bound, (stat, bound, tv, n)
