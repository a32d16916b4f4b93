"""gamma choice (host/decode/gamma.py): the expected-tokens formula, the cost fits, and the controller's choices
in simulated streams whose acceptance and costs are known."""

import random

import pytest

from specmesh.host.decode.gamma import (
    MAX_PROBE_GAP, PRIOR_DECAY, PRIOR_WEIGHT, PROBE_EVERY, PROBES, UNINFORMED_WEIGHT, GammaController, LinearFit,
    expected_tokens,
)

OPENING_DRAFTS = sum(1 for g in PROBES if g)  # rounds of the opening probes that draft


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 0.99])
@pytest.mark.parametrize("gamma", [0, 1, 4, 8])
def test_expected_tokens_is_the_geometric_series(alpha, gamma):
    assert expected_tokens(alpha, gamma) == pytest.approx(sum(alpha ** i for i in range(gamma + 1)))


def test_expected_tokens_at_full_acceptance():
    assert expected_tokens(1.0, 5) == 6.0


def test_linear_fit_recovers_a_line_and_stays_non_negative():
    fit = LinearFit(decay=1.0)
    for x in (1, 2, 5, 9):
        fit.add(x, 0.003 + 0.002 * x)
    a, b = fit.coefficients()
    assert a == pytest.approx(0.003) and b == pytest.approx(0.002)
    single = LinearFit()
    single.add(4, 0.02)
    single.add(4, 0.02)
    assert single.coefficients() == pytest.approx((0.0, 0.005))  # one size seen: cost taken as proportional
    falling = LinearFit(decay=1.0)
    falling.add(1, 0.01)
    falling.add(5, 0.002)
    a, b = falling.coefficients()
    assert b == 0.0 and a == pytest.approx(0.006)


def simulate(alpha, draft_s, verify, overhead, rounds=300, seed=0):
    """Run a controller against a stream with i.i.d. acceptance alpha and exact costs; gamma histogram."""
    rng = random.Random(seed)
    c = GammaController()
    hist = {}
    for _ in range(rounds):
        g = c.choose()
        n = 0
        while n < g and rng.random() < alpha:
            n += 1
        c.observe(g, n, draft_s * g, verify(g + 1), overhead)
        hist[g] = hist.get(g, 0) + 1
    return c, hist


def best_gamma(alpha, draft_s, verify, overhead, max_gamma=8):
    def rate(g):
        return expected_tokens(alpha, g) / (draft_s * g + verify(g + 1) + overhead)
    return max(range(max_gamma + 1), key=rate)


def test_compute_bound_verifier_with_costly_drafter_decodes_plain():
    # a microcontroller target: v(k) = k; drafter at half the target's cost; modest acceptance
    verify = lambda k: 0.010 * k
    c, hist = simulate(0.5, 0.005, verify, 0.001)
    assert best_gamma(0.5, 0.005, verify, 0.001) == 0
    assert hist.get(0, 0) > 0.95 * sum(hist.values())
    # even alpha = 1 could not pay here, as measured: probes come rarely (their gaps double)
    assert hist.get(1, 0) <= PROBES.count(1) + 5


@pytest.mark.parametrize("alpha", [0.6, 0.8, 0.9])
def test_memory_bound_verifier_with_cheap_drafter_speculates_at_the_best_gamma(alpha):
    # a GPU-like target: v(k) ~ 1; drafter 5% of a verify
    verify = lambda k: 0.010 + 0.0002 * k
    want = best_gamma(alpha, 0.0005, verify, 0.0005)
    assert want >= 2
    c, hist = simulate(alpha, 0.0005, verify, 0.0005, seed=int(alpha * 10))
    chosen = max(hist, key=hist.get)
    # the estimate of alpha is noisy: accept a neighbour whose true rate is within 3% of the best
    def rate(g):
        return expected_tokens(alpha, g) / (0.0005 * g + verify(g + 1) + 0.0005)
    assert rate(chosen) >= 0.97 * rate(want)
    assert c.summary()["verify_v"][7] == pytest.approx(verify(8) / verify(1), rel=0.05)


def test_fixed_gamma_is_kept_and_capped_by_the_room_left():
    c = GammaController(fixed=5)
    assert [c.choose() for _ in range(3)] == [5, 5, 5]
    assert c.choose(limit=2) == 2
    assert GammaController(fixed=0).choose() == 0


def test_probing_order_then_never_beyond_the_limit():
    c = GammaController()
    got = []
    for _ in range(len(PROBES)):
        got.append(c.choose(limit=8))
        c.observe(got[-1], 0, 0.001 * got[-1], 0.01, 0.0)
    assert got == list(PROBES)
    for _ in range(40):
        g = c.choose(limit=1)
        assert 0 <= g <= 1
        c.observe(g, 0, 0.001 * g, 0.01, 0.0)


def test_drafter_catch_up_after_plain_rounds_is_not_charged_to_the_drafts():
    c = GammaController()
    per_pass, verify = 0.001, 0.010
    c.observe(1, 1, per_pass * 1, verify * 1.5, 0.0)
    c.observe(0, 0, 0.0, verify, 0.0)
    c.observe(1, 0, per_pass * (30 + 1), verify * 1.5, 0.0, lag=30)  # 30 plain tokens fed before drafting
    assert c.summary()["cost_ratio_c"] == pytest.approx(per_pass / verify, rel=0.01)


def test_a_drafter_call_that_costs_its_round_trip_is_not_halved_after_one_probe():
    # a numpy-like verifier (v(k) = 2.0 + 0.1k ms) and a drafter whose call costs 1 ms whatever its size;
    # the opening probe drafts 1 token after 1 catch-up token (2 positions) and is rejected
    verify = lambda k: 0.0020 + 0.0001 * k
    c = GammaController()
    for g in PROBES:
        assert c.choose() == g
        c.observe(g, 0, 0.001 if g else 0.0, verify(g + 1), 0.0, lag=1 if g else 0, timed=c.rounds > 0)
    # gamma = 1 at alpha = 1/3 commits 1.33 tokens in 3.2 ms against 1 in 2.1 ms: plain is faster
    assert c.choose() == 0


def test_measured_costs_that_could_not_pay_even_at_full_acceptance_are_probed_rarely():
    # v(k) = k and a drafter at 0.2 of a target step: even alpha = 1 loses (k + 1 tokens for 1.2k + 1 steps);
    # measured costs may have been a noisy round's, so probes go on, each interval twice the last
    c, hist = simulate(alpha=1.0, draft_s=0.002, verify=lambda k: 0.01 * k, overhead=0.0, rounds=400)
    assert not c.could_pay(c.max_gamma)
    assert OPENING_DRAFTS < sum(n for g, n in hist.items() if g > 0) <= OPENING_DRAFTS + 5


def drafting_rounds(gammas: list[int]) -> list[int]:
    return [i for i, g in enumerate(gammas) if g > 0]


def test_a_drafter_that_never_agrees_costs_a_few_spaced_probes():
    # full acceptance would pay (v(k) = 1 + 0.2k), but nothing is accepted and a drafter token costs 25% of
    # a plain round: after the opening, probes only, each interval twice the last, never over MAX_PROBE_GAP
    rng = random.Random(0)
    c, got = GammaController(), []
    for _ in range(600):
        got.append(c.choose())
        c.observe(got[-1], 0, 0.003 * got[-1] * (1 + 0.1 * rng.random()), 0.01 + 0.002 * (got[-1] + 1), 0.0)
    assert c.could_pay(c.max_gamma)
    probes = [i for i in drafting_rounds(got) if i >= len(PROBES)]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert got.count(0) > 0.97 * len(got)
    assert 3 <= len(probes) <= 9 and all(PROBE_EVERY <= g <= MAX_PROBE_GAP + 1 for g in gaps)
    assert gaps == sorted(gaps)


def test_after_many_plain_rounds_drifting_costs_do_not_switch_speculation_on_outside_a_probe():
    # the opening probe sees v(2) = 1.45 v(1); then the host slows down and plain rounds cost twice as much,
    # so the decayed fit's slope flattens and gamma = 1 starts to look better than plain. Turning it on
    # would first cost the drafter a catch-up over every plain token since (here 16% of a round each).
    c = GammaController()
    got = []
    for i in range(150):
        g = c.choose()
        got.append(g)
        v1 = 0.010 if i < 10 else 0.020
        c.observe(g, 0, 0.0016 * (g + (1 if g else 0)), v1 + 0.0045 * g, 0.0, lag=1 if g else 0)
    assert got[:len(PROBES)] == list(PROBES)
    # drafting after the opening: scheduled probes (and a round or two the rates try right after one),
    # never a stale fit's switch that stays on
    later = [i for i in drafting_rounds(got) if i >= len(PROBES)]
    assert 0 < len(later) <= 8


def test_probes_continue_where_full_acceptance_would_pay():
    # memory-bound verifier (v(k) = 1): speculation pays at high alpha, so alpha stays measured
    c, hist = simulate(alpha=0.05, draft_s=0.001, verify=lambda k: 0.01, overhead=0.0, rounds=400)
    assert c.could_pay(c.max_gamma)
    assert hist.get(0, 0) > 300 and sum(n for g, n in hist.items() if g > 0) > OPENING_DRAFTS


def s3_costs(g):
    """(draft, verify, commit) seconds of a round of g drafts: a verify of k positions costs 0.67 + 0.33k plain
    steps of 19.5 ms (native kernels on an ESP32-S3), a draft 1 ms."""
    return 0.001 * g, 0.0195 * (0.67 + 0.33 * (g + 1)), 0.0


def early_rejections(c: GammaController, rounds: int = 3) -> int:
    """Feed `rounds` drafting rounds that each reject their first draft; the gamma chosen next."""
    c.prime(s3_costs)
    c.observe(0, 0, 0.0, 0.0, 0.0, timed=False)  # the prefill round
    for _ in range(rounds):
        g = max(1, c.choose())
        c.observe(g, 0, *s3_costs(g))
    return c.choose()


def test_a_measured_acceptance_keeps_gamma_on_through_a_few_early_rejections():
    plain_start = GammaController()
    assert early_rejections(plain_start) == 0  # Beta(1, 1): three rejections read as alpha 0.2, plain
    primed = GammaController()
    primed.expect(0.8)
    assert primed.alpha == pytest.approx(0.8)
    assert early_rejections(primed) > 0 and 0.5 < primed.alpha < 0.8  # the evidence still pulls it down
    doubted = GammaController()
    doubted.expect(0.8)
    assert early_rejections(doubted, rounds=30) == 0  # a drafter that keeps failing is still turned off


def test_a_measured_prior_gives_way_to_the_streams_own_evidence():
    # a drafter measured at 0.8 on other prompts that agrees 40% of the time on this stream, one draft a round
    c = GammaController()
    c.expect(0.8)
    before = GammaController(prior_share=1.0 / PRIOR_DECAY ** 60)  # the prior held at its full weight throughout
    before.expect(0.8)
    for i in range(60):
        for x in (c, before):
            x.observe(1, int(i % 5 in (0, 2)), 0.001, 0.02, 0.0)
    assert c.prior_weight_now == UNINFORMED_WEIGHT and before.prior_weight_now == pytest.approx(PRIOR_WEIGHT)
    assert c.alpha < 0.45 < 0.5 < before.alpha  # at full weight the prior kept it at gamma 1's break-even and above
    for _ in range(300):  # a plain stretch without shadows tests nothing: the prior regains its weight as the
        c.observe(0, 0, 0.0, 0.02, 0.0)  # evidence ages, so a scheduled probe is back at the drafter's prior
    assert c.prior_weight_now > 0.9 * PRIOR_WEIGHT and c.alpha > 0.7


def test_a_drafter_the_model_card_did_not_measure_keeps_the_flat_prior():
    c, flat = GammaController(), GammaController()
    c.expect(None)  # expected_alpha's answer for a file the card does not name
    assert (c.alpha, c.prior_weight_now) == (flat.alpha, flat.prior_weight_now)
    c.expect(0.9)
    assert c.alpha == pytest.approx(0.9)


def test_known_costs_price_each_verify_at_the_streams_position():
    # an S3-like verify, known beforehand as under --project: a one-position pass is code of its own (cheaper
    # than the line through the others), and every pass grows with the context (its KV reads)
    def verify_at(k, pos):
        return 0.0195 * (0.67 + 0.33 * k + (0.08 if k > 1 else 0.0)) * (1 + pos / 200)

    c = GammaController()
    c.prime(lambda g: (0.001 * g, verify_at(g + 1, 16), 0.0), verify_at)
    for _ in range(40):  # drafting rounds of one size, later and later: all the fit hears
        c.choose(position=16 + 2 * _)
        c.observe(1, 1, 0.001, verify_at(2, 16 + 2 * _), 0.0)
    c.choose(position=96)
    fit_plain = c.verify_cost(1)
    assert c.round_times(2)[0] == pytest.approx(verify_at(1, 96))  # the plain round, priced where it runs
    assert c.round_times(2)[2] == pytest.approx(verify_at(3, 96) + c.draft_cost(2))
    assert abs(fit_plain - verify_at(1, 96)) > 0.05 * verify_at(1, 96)  # what the fit alone would have said


def memory_bound(g: int) -> tuple[float, float, float]:
    """(draft, verify, commit) seconds of a round of g drafts on a GPU-like verifier with a cheap drafter."""
    return 0.0005 * g, 0.010 + 0.0002 * (g + 1), 0.0005


@pytest.mark.parametrize("slow_round", [2, 3, 40])  # the opening gamma = 1 probe, the gamma = 4 one, mid-stream
def test_a_noisy_slow_round_does_not_end_speculation(slow_round):
    # measured costs; one scripted round takes 40 times its cost (a scheduling hiccup of a shared host)
    rng = random.Random(slow_round)
    c, got = GammaController(), []
    for i in range(300):
        g = c.choose()
        got.append(g)
        n = 0
        while n < g and rng.random() < 0.8:
            n += 1
        t_draft, t_verify, t_other = memory_bound(g)
        if i == slow_round:
            t_draft, t_verify = 40 * t_draft, 40 * t_verify
        c.observe(g, n, t_draft, t_verify, t_other, timed=i > 0)
    assert sum(1 for g in got[-100:] if g > 0) >= 95


def test_a_drafter_that_truly_cannot_pay_decodes_plainly_without_probes():
    # known costs (a projection): v(k) = k and a drafter pass at 0.3 of a target step: even alpha = 1 loses
    c, got = GammaController(), []
    c.prime(lambda g: (0.003 * g, 0.010 * (g + 1), 0.0))
    for i in range(500):
        got.append(c.choose())
        c.observe(got[-1], got[-1], *(0.003 * got[-1], 0.010 * (got[-1] + 1), 0.0), timed=i > 0)
    assert not c.could_pay(c.max_gamma) and sum(got) == 0


def test_speculation_returns_after_a_stretch_where_the_drafter_disagrees():
    # an ESP32-S3 verifier's projected costs; the drafter agrees 10% of the time for rounds 10-60, then 85%
    rng = random.Random(1)
    c, got = GammaController(), []
    c.expect(0.8)
    c.prime(s3_costs)
    for i in range(500):
        g = c.choose()
        got.append(g)
        alpha = 0.1 if 10 <= i < 60 else 0.85
        n = 0
        while n < g and rng.random() < alpha:
            n += 1
        c.observe(g, n, *s3_costs(g), timed=i > 0)
    assert got[40:60].count(0) >= 10  # it did stop drafting while the drafter disagreed
    back = next(i for i in range(60, 500) if got[i] > 0)
    assert back < 60 + MAX_PROBE_GAP + 1
    assert sum(1 for g in got[back:] if g > 0) >= 0.9 * (500 - back)
