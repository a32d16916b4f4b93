"""Unit tests of shared/prng.py, shared/rule.py and shared/sampling.py (exact, non-statistical cases)."""

import math

import pytest

from specmesh.shared import intmath, prng, rule, sampling
from specmesh.shared.rule import ONE


def test_rand32_is_a_pure_32bit_function_of_all_arguments():
    a = prng.rand32(7, 100, prng.EMIT)
    assert a == prng.rand32(7, 100, prng.EMIT) and 0 <= a < 2 ** 32
    others = {prng.rand32(8, 100, prng.EMIT), prng.rand32(7, 101, prng.EMIT),
              prng.rand32(7, 100, prng.ACCEPT), prng.rand32(7, 100, prng.EMIT, 1)}
    assert a not in others and len(others) == 4
    assert prng.rand32(7 + 2 ** 32, 100, prng.EMIT) == a  # arguments are taken modulo 2^32


def test_uniform_range_and_rejection():
    for n in (1, 2, 3, 5, 1000, ONE, 2 ** 32):
        vals = [prng.uniform(s, 1, prng.EMIT, n) for s in range(200)]
        assert all(0 <= v < n for v in vals)
    assert prng.uniform(1, 2, 3, 1) == 0
    # n = 5 masks to 3 bits and rejects 5..7: the result is the first masked draw below 5
    for s in range(50):
        a = 0
        while prng.rand32(s, 0, 1, a) & 7 >= 5:
            a += 1
        assert prng.uniform(s, 0, 1, 5) == prng.rand32(s, 0, 1, a) & 7
    with pytest.raises(ValueError):
        prng.uniform(1, 1, 1, 0)


def test_quantize_sums_to_one_and_keeps_zeros():
    w = rule.quantize([1, 0, 2, 7])
    assert sum(w) == ONE and w[1] == 0
    assert rule.quantize([5]) == [ONE]
    assert rule.quantize([1, 1, 1]) == [21846, 21845, 21845]  # one spare unit, tie to the lowest id
    assert rule.quantize([2, 6]) == [ONE // 4, 3 * ONE // 4]  # scale-free
    assert rule.quantize([3, 1, 3]) == [28087, 9362, 28087]  # remainders 6/7, 2/7, 6/7: 2 spare units
    tiny = rule.quantize([1] + [10 ** 9] * 3)
    assert tiny[0] == 0 and sum(tiny) == ONE


@pytest.mark.parametrize("bad", [[], [0, 0], [5, -1]])
def test_quantize_rejects_non_distributions(bad):
    with pytest.raises(ValueError):
        rule.quantize(bad)


NAN = float("nan")


@pytest.mark.parametrize("call", [lambda: rule.argmax([1, NAN, 0.5]), lambda: rule.argmax([NAN, 1.0]),
                                  lambda: rule.top_ids([1, NAN, 0.5], 1), lambda: rule.top_ids([NAN, 1, 0.5], 2)])
def test_a_nan_value_is_an_error(call):
    with pytest.raises(ValueError):
        call()


def test_top_ids_argmax_ties_to_lowest_id():
    assert rule.top_ids([1, 3, 3, 2, 3], 2) == [1, 2]
    assert rule.top_ids([1, 3, 3, 2, 3], 10) == [1, 2, 4, 3, 0]
    assert rule.top_ids([5], 0) == []
    assert rule.argmax([0, 2, 2, 1]) == 1


def test_quantize_topk():
    ids, w = rule.quantize_topk([5, 50, 5, 30, 10], 3)
    assert ids == [1, 3, 4] and sum(w) == ONE and w[0] > w[1] > w[2]
    assert rule.quantize_topk([0, 1, 0], 3) == ([1], [ONE])  # zero weights dropped
    assert rule.quantize_topk([25] * 4, 2) == ([0, 1], [ONE // 2, ONE // 2])


P = rule.quantize([4, 3, 2, 1, 0])


def test_verify_q_equal_p_accepts_everything():
    q = ([0, 1, 2, 3], P[:4])
    for seed in range(100):
        n, tok = rule.verify([P] * 4, [0, 3, 2], [q] * 3, seed, 10)
        assert n == 3 and tok == rule.sample(P, seed, 13, prng.EMIT)


def test_verify_rejects_a_draft_the_target_cannot_emit():
    q = ([4], [ONE])  # the drafter is certain of token 4, which has p = 0
    for seed in range(100):
        n, tok = rule.verify([P, P], [4], [q], seed, 0)
        assert n == 0 and tok == rule.sample(P, seed, 0, prng.EMIT)  # residual = p, drawn from EMIT at pos0


def test_verify_first_rejected_draws_from_residual_only():
    q = ([0], [ONE])  # p(0) = 0.4 < q(0) = 1: residual excludes token 0 entirely
    outcomes = {rule.verify([P, P], [0], [q], seed, 5) for seed in range(400)}
    rejected = {tok for n, tok in outcomes if n == 0}
    assert rejected == {1, 2, 3}
    assert {n for n, _ in outcomes} == {0, 1}


def test_verify_accepts_when_target_is_at_least_draft():
    q = ([0, 1], [ONE // 2, ONE // 2])
    p = [0, ONE, 0, 0, 0]
    for seed in range(50):
        assert rule.verify([p, p, P], [1, 1], [q, q], seed, 0)[0] == 2


def test_verify_eos_inside_accepted_run_ends_stream():
    q = ([0, 1, 2, 3], P[:4])
    assert rule.verify([P] * 4, [0, 2, 1], [q] * 3, 1, 0, eos=2) == (2, -1)


def test_verify_is_deterministic_in_seed_and_position():
    q = rule.quantize_topk([1, 1, 4, 4, 0], 2)
    runs = [rule.verify([P] * 3, [2, 3], [q, q], s, 40) for s in range(64)]
    assert runs == [rule.verify([P] * 3, [2, 3], [q, q], s, 40) for s in range(64)]
    assert runs != [rule.verify([P] * 3, [2, 3], [q, q], s, 41) for s in range(64)]


@pytest.mark.parametrize("args", [
    ([P], [1], [([1], [ONE])]),  # missing bonus table
    ([P, P], [1], [([2], [ONE])]),  # draft not in its q-hat
    ([P, P], [1], [([1, 2], [ONE - 2, 1])]),  # q-hat does not sum to ONE
    ([P, P], [1], [([1, 2], [ONE, 1])]),  # nor here
    ([P, P], [1], [([1], [ONE + 1])]),  # a partial table above ONE
])
def test_verify_rejects_inconsistent_input(args):
    with pytest.raises(ValueError):
        rule.verify(*args, 0, 0)


def test_a_partial_table_gives_the_verdict_of_the_whole_one_or_asks_for_it():
    """A draft sent with its own weight only is accepted exactly when its whole table would be; at its
    rejection the verdict is PARTIAL, and sample_residual on the whole table gives the token verify would."""
    q = ([0, 1, 3], [50000, 10000, 5536])
    partial = ([0], [50000])
    seen = set()
    for seed in range(300):
        want = rule.verify([P, P, P], [0, 3], [q, ([3], [ONE])], seed, 7)
        got = rule.verify([P, P, P], [0, 3], [partial, ([3], [ONE])], seed, 7)
        if got[1] == rule.PARTIAL:
            assert want[0] == got[0] == 0
            got = (0, rule.sample_residual(P, q[0], q[1], seed, 7))
        seen.add(want[0])
        assert got == want
    assert seen == {0, 1, 2}  # rejected at the partial table, after it, and all accepted


def test_residual_rejects_repeated_ids():
    with pytest.raises(ValueError):
        rule.sample_residual(P, [1, 1], [ONE // 2, ONE // 2], 0, 0)


def test_verify_greedy():
    assert rule.verify_greedy([4, 5, 6], [4, 5]) == (2, 6)
    assert rule.verify_greedy([4, 5, 6], [4, 7]) == (1, 5)
    assert rule.verify_greedy([4, 5, 6], [9, 5]) == (0, 4)
    assert rule.verify_greedy([4, 5, 6], [4, 5], eos=4) == (1, -1)
    assert rule.verify_greedy([3], []) == (0, 3)
    with pytest.raises(ValueError):
        rule.verify_greedy([1], [1])


EXP = intmath.exp_table([0] * intmath.EXP_SIZE)
Q16 = 1 << 16


def test_weights_follow_exp_of_the_temperature_scaled_logits():
    logits = [0, Q16, 3 * Q16, 3 * Q16 - 1]
    out = [0] * 4
    total = sampling.weights(logits, 0, 4, 1000, EXP, out)
    assert out[2] == 1 << 15 and total == sum(out)  # the argmax weighs 2^15
    for v, w in zip(logits, out):
        assert w == pytest.approx(2 ** 15 * math.exp((v - 3 * Q16) / Q16), abs=2)
    hot = [0] * 4
    sampling.weights(logits, 0, 4, 2000, EXP, hot)
    assert hot[1] == pytest.approx(2 ** 15 * math.exp(-1.0), abs=2)  # T = 2 halves the gap
    far = [0] * 2
    sampling.weights([0, 100 * Q16], 0, 2, 1000, EXP, far)
    assert far == [0, 1 << 15]  # exp(-100) rounds to 0


def test_tables_apply_greedy_top_k_and_top_p():
    logits = [0, 4 * Q16, 3 * Q16, 3 * Q16, 0]
    assert sampling.table(logits, 0, 5, 0, 0, 0, EXP) == [0, ONE, 0, 0, 0]
    full = sampling.table(logits, 0, 5, 1000, 0, 0, EXP)
    assert sum(full) == ONE and full[1] > full[2] == full[3] > full[0] == full[4] > 0
    assert full == sampling.table([9] * 3 + logits, 3, 5, 1000, 0, 65536, EXP)  # offset; top_p 1.0 is off
    top2 = sampling.table(logits, 0, 5, 1000, 2, 0, EXP)
    assert top2[0] == top2[3] == top2[4] == 0 and top2[1] > top2[2] > 0  # ties: the lowest id stays
    # top-p 0.5: token 1 alone holds 1/(1 + 2/e) = 58% of the mass
    assert sampling.table(logits, 0, 5, 1000, 0, 32768, EXP) == [0, ONE, 0, 0, 0]
    p80 = sampling.table(logits, 0, 5, 1000, 0, 52429, EXP)
    assert p80[2] > 0 and p80[3] > 0 and p80[0] == 0


def test_draft_table_is_the_top_k_renormalised():
    logits = [0, 4 * Q16, 3 * Q16, 3 * Q16, 0]
    ids, w = sampling.draft_table(logits, 0, 5, 1000, 2, EXP)
    assert ids == [1, 2] and sum(w) == ONE
    assert w[1] / ONE == pytest.approx(1 / (1 + math.e), abs=1e-4)
    assert sampling.draft_table(logits, 0, 5, 0, 8, EXP) == ([1], [ONE])


def _plain_quantize(w):
    """Largest remainder to ONE, ties to the lowest id, as the rule's docstring says it (exact ints, sorting)."""
    total = sum(w)
    out = [x * ONE // total for x in w]
    by = sorted((i for i in range(len(w)) if w[i] > 0), key=lambda i: (-(w[i] * ONE % total), i))
    for i in by[:ONE - sum(out)]:
        out[i] += 1
    return out


def _plain_table(logits, temp, top_k, top_p_q16, tab):
    """sampling.table as its docstring says it, with fresh lists at every step: the reference."""
    n = len(logits)
    w = [0] * n
    sampling.weights(logits, 0, n, temp, tab, w)
    if 0 < top_k < n:
        keep = set(rule.top_ids(logits, top_k))
        w = [w[i] if i in keep else 0 for i in range(n)]
    if 0 < top_p_q16 < 65536:
        kept, mass = [0] * n, 0
        for i in sorted((i for i in range(n) if w[i]), key=lambda i: (-logits[i], i)):
            if mass << 16 >= top_p_q16 * sum(w) and mass:
                break
            kept[i], mass = w[i], mass + w[i]
        w = kept
    return _plain_quantize(w)


@pytest.mark.parametrize("seed", range(20))
def test_quantize_and_table_into_buffers_equal_the_plain_rule(seed):
    """A board's preallocated tables (sampling.buffers: array('i') and a list sorted in place, reused row after row)
    give the very integers of the rule written plainly, with temperature alone, top-k and top-p."""
    import random

    rng = random.Random(seed)
    n = rng.choice([3, 17, 512])
    tab = intmath.exp_table([0] * intmath.EXP_SIZE)
    bufs = sampling.buffers(n)
    for _ in range(3):
        logits = [rng.randrange(-(1 << 22), 1 << 22) for _ in range(n)]
        temp = rng.choice([1, 300, 1000, 2500])
        top_k = rng.choice([0, 0, 1, 2, 40])
        top_p = rng.choice([0, 65536, 1, 30000, 58982])
        want = _plain_table(logits, temp, top_k, top_p, tab)
        assert list(sampling.table(logits, 0, n, temp, top_k, top_p, tab, bufs)) == want and sum(want) == ONE
        assert sampling.table(logits, 0, n, temp, top_k, top_p, tab) == want
    w = [rng.randrange(0, 1 << 15) for _ in range(n)] + [1, 1 << 15]
    want = _plain_quantize(w)
    assert rule.quantize(w) == want
    assert list(rule.quantize(w, [0] * (n + 2), [0] * (n + 2), [0] * (n + 2))) == want
    assert list(rule.quantize(list(w), [0] * (n + 2), w, [0] * (n + 2))) == want  # the remainders over the weights


def test_judge_is_verifys_step():
    p = rule.quantize([5, 1, 0, 9])
    for x, ids, w in ((0, [0, 3], [30000, ONE - 30000]), (3, [1, 3], [ONE - 100, 100]), (1, [1], [ONE])):
        for pos in range(30):
            t = rule.judge(p, x, ids, w, 11, pos)
            acc, tok = rule.verify([p, p], [x], [(ids, w)], 11, pos)
            assert (acc, tok) == ((1, tok) if t < 0 else (0, t))
