"""Pipelined drafting (host/decode/ahead.py): the drafter's timeline during a pending verdict, the decode loop's
guess at the bonus position (the text unchanged), and the projection's replay crediting hits and charging
the waste of thrown-away ahead passes (host/projection/rounds.py)."""

import pytest

from specmesh.host.backends import LocalDrafter, LocalVerifier, SessionParams
from specmesh.host.decode.ahead import best_lookahead, expected_draft, round_draft
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import Round, generate
from specmesh.host.projection.rounds import Projector
from specmesh.shared.modelfile import FLAG_SHARED_CLS, Header
from specmesh.tools.testmodels import random_model

PASS = [1.0] * 12


def test_no_lookahead_drafts_the_block_from_scratch():
    assert round_draft(PASS, 4, 0, 10.0, True) == (4.0, 0.0)
    assert round_draft(PASS, 4, 0, 10.0, False) == (4.0, 0.0)


def test_a_hit_waits_only_for_the_drafts_not_finished_in_the_window():
    assert round_draft(PASS, 3, 4, 10.0, True) == (0.0, 0.0)  # guess + 3 drafts by t = 4 < 10
    assert round_draft(PASS, 3, 4, 2.5, True) == (1.5, 0.0)  # the third draft ends at 4
    assert round_draft(PASS, 5, 3, 10.0, True) == (3.0, 0.0)  # passes 3..5 start after the request


def test_a_miss_finishes_the_pass_in_progress_then_drafts_afresh():
    assert round_draft(PASS, 3, 4, 2.5, False) == (3.5, 0.5)  # pass 2 ends at 3: half a pass wasted
    assert round_draft(PASS, 3, 2, 2.5, False) == (3.0, 0.0)  # it had stopped: nothing in progress


def test_the_planned_lookahead_pays_when_hits_are_likely_and_not_when_rare():
    a = best_lookahead(1.0, 4, 3.3, 0.9)
    assert a > 0 and expected_draft(1.0, 4, a, 3.3, 0.9) < expected_draft(1.0, 4, 0, 3.3, 0.9)
    assert best_lookahead(1.0, 4, 3.3, 0.0) == 0  # every ahead pass thrown away: only the waste is left


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    random_model(d / "t.spm", dim=32, n_layers=2, hidden=64, vocab=64, max_seq=96, seed=11)
    random_model(d / "d.spm", dim=32, n_layers=2, hidden=64, vocab=64, max_seq=96, seed=11)  # the same: hits
    random_model(d / "o.spm", dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, vocab=64, max_seq=96, seed=3)
    return d


@pytest.mark.parametrize("drafter, temperature", [("d.spm", 0.0), ("o.spm", 0.0), ("o.spm", 0.9)])
def test_the_guess_leaves_the_text_unchanged_and_says_whether_the_ahead_drafts_serve(models, drafter, temperature):
    params = SessionParams(seed=4, temperature=temperature)
    prompt = [3, 9, 1]
    want = generate(prompt, LocalVerifier(models / "t.spm"), LocalDrafter(models / drafter), params, 40,
                    GammaController(max_gamma=3, fixed=3)).tokens
    c = GammaController(max_gamma=3, fixed=3, fixed_ahead=2)
    res = generate(prompt, LocalVerifier(models / "t.spm"), LocalDrafter(models / drafter), params, 40, c)
    assert res.tokens == want
    assert all(r.ahead == 2 for r in res.rounds if r.gamma)
    assert all(r.n_accepted == r.gamma for r in res.rounds if r.guess_hit)
    if drafter == "d.spm" and not temperature:  # the drafter is the target: every guess is right
        assert all(r.guess_hit for r in res.rounds[:-1] if r.gamma)
    # the next round's first tokens are the drafter's own: a hit means the guess is the token committed
    check = LocalDrafter(models / drafter)
    stream = prompt + res.tokens
    check.begin(params, prompt)
    for r in res.rounds:
        if r.guess_hit:
            at = r.pos0 + r.gamma
            assert check.draft(stream[:at], 1).tokens == [stream[at]]


TARGET = Header(128, 6, 4, 2, 352, 512, 256, flags=FLAG_SHARED_CLS)
DRAFTER = Header(32, 2, 4, 2, 96, 512, 256, flags=FLAG_SHARED_CLS)


def rnd(pos0, hit, ahead=3):
    return Round(gamma=2, n_accepted=2 if hit else 1, n_committed=3 if hit else 2, pos0=pos0, draft_body=3 + 2 * 2,
                 verify_body=2 + 2 * 2, rejected=not hit, ahead=ahead, guess_hit=hit)


def test_the_replay_credits_hits_and_charges_the_waste():
    p = Projector(TARGET, DRAFTER, "esp32s3")
    assert p.pipelined
    hits = p.replay([rnd(10, True), rnd(13, True), rnd(16, True)])
    plain = [p.round_costs(r) for r in (rnd(10, True), rnd(13, True), rnd(16, True))]
    assert hits[0][0] == pytest.approx(plain[0][0])  # the first round has nothing drafted ahead
    assert hits[1][0] < plain[1][0] and hits[1][2] == 0.0
    misses = p.replay([rnd(10, False), rnd(12, False)])
    assert misses[1][0] == pytest.approx(plain[1][0] + misses[1][2])  # a fresh block plus any waste
    off = Projector(TARGET, DRAFTER, "esp32s3", "espnow")  # the drafter is the gateway: not credited
    assert not off.pipelined and off.replay([rnd(10, True), rnd(13, True)])[1][0] == pytest.approx(
        off.round_costs(rnd(13, True))[0])
