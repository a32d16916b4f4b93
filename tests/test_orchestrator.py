"""The decode loop (host/decode/orchestrator.py) with the local numpy back-ends (host/backends/__init__.py):
greedy speculative output equals plain output, sampling is reproducible, stops are honoured."""

import random

import pytest

from specmesh.host.backends import (Draft, LocalDrafter, LocalVerifier, SessionParams, temp_milli, temperature_from_milli,
                           top_p_q16)
from specmesh.host.decode.gamma import GammaController
from specmesh.host.cli.output import Watch
from specmesh.host.decode.orchestrator import generate
from specmesh.host.decode.stopstrings import StopScan, StopStrings
from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.tools.testmodels import random_model

VOCAB = 64


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    target = d / TARGET_FILE
    drafter = d / DRAFTER_FILE
    random_model(target, dim=32, n_layers=2, hidden=64, vocab=VOCAB, max_seq=96, seed=11)
    random_model(drafter, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, vocab=VOCAB, max_seq=96, seed=12)
    return str(target), str(drafter)


@pytest.fixture(scope="module")
def backends(models):
    return LocalVerifier(models[0]), LocalDrafter(models[1]), LocalDrafter(models[0])


def prompts(n, seed=5):
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randrange(1, 9))] for _ in range(n)]


def test_greedy_speculative_equals_plain_for_20_prompts(backends):
    verifier, drafter, _ = backends
    params = SessionParams(seed=0, temperature=0.0)
    accepted = 0
    for i, prompt in enumerate(prompts(20)):
        plain = generate(prompt, verifier, None, params, 24)
        spec = generate(prompt, verifier, drafter, params, 24, GammaController(fixed=1 + i % 6))
        assert spec.tokens == plain.tokens, "prompt %d" % i
        assert len(plain.tokens) == 24 and all(r.gamma == 0 for r in plain.rounds)
        accepted += spec.accepted
    assert accepted > 0  # some drafts were accepted, so the comparison exercised accepted runs


def test_greedy_with_the_target_as_drafter_accepts_everything(backends):
    verifier, _, self_drafter = backends
    params = SessionParams(temperature=0.0)
    plain = generate([3, 1, 4], verifier, None, params, 30)
    spec = generate([3, 1, 4], verifier, self_drafter, params, 30, GammaController(fixed=4))
    assert spec.tokens == plain.tokens
    assert spec.alpha == 1.0
    assert spec.tokens_per_verification == 5.0  # 6 rounds of 4 accepted + 1 bonus


def test_gamma_is_capped_at_the_back_ends_limits(models):
    verifier, drafter = LocalVerifier(models[0]), LocalDrafter(models[1])
    params = SessionParams(temperature=0.0)
    plain = generate([3, 1, 4], verifier, None, params, 30)
    drafter.max_gamma = 2  # what a board's HELLO would report
    spec = generate([3, 1, 4], verifier, drafter, params, 30, GammaController(max_gamma=6, fixed=6))
    assert spec.tokens == plain.tokens and max(r.gamma for r in spec.rounds) == 2
    drafter.max_gamma, verifier.max_gamma = 6, 3
    spec = generate([3, 1, 4], verifier, drafter, params, 30, GammaController(max_gamma=6, fixed=6))
    assert spec.tokens == plain.tokens and max(r.gamma for r in spec.rounds) == 3


def test_adaptive_gamma_output_equals_plain(backends):
    verifier, drafter, _ = backends
    params = SessionParams(temperature=0.0)
    for prompt in prompts(4, seed=9):
        assert (generate(prompt, verifier, drafter, params, 40).tokens
                == generate(prompt, verifier, None, params, 40).tokens)


def test_sampling_same_seed_same_text_and_seed_matters(backends):
    verifier, drafter, _ = backends
    runs = [generate([7, 8], verifier, drafter, SessionParams(seed=s, temperature=0.9, draft_top_k=8), 30,
                     GammaController(fixed=3)).tokens for s in (42, 42, 43)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_sampling_plain_is_speculation_with_gamma_zero(backends):
    # gamma = 0 rounds draw the very same PRNG numbers as plain decoding (CONTRACTS: purpose EMIT)
    verifier, drafter, _ = backends
    params = SessionParams(seed=9, temperature=1.0, target_top_k=20)
    assert (generate([5], verifier, drafter, params, 25, GammaController(fixed=0)).tokens
            == generate([5], verifier, None, params, 25).tokens)


def test_eos_ends_the_stream_and_is_not_output(backends):
    verifier, drafter, _ = backends
    plain = generate([2, 9], verifier, None, SessionParams(), 30).tokens
    eos = plain[10]
    cut = plain[:plain.index(eos)]
    params = SessionParams(eos=eos)
    for d, g in ((None, None), (drafter, 2), (drafter, 5)):
        res = generate([2, 9], verifier, d, params, 30, GammaController(fixed=g) if g else None)
        assert res.tokens == cut and res.stop == "eos"


def test_stops_at_max_tokens_and_at_the_context(backends):
    verifier, drafter, _ = backends
    res = generate([1], verifier, drafter, SessionParams(), 7, GammaController(fixed=5))
    assert len(res.tokens) == 7 and res.stop == "max_tokens"
    long = generate(list(range(60)), verifier, drafter, SessionParams(), 1000, GammaController(fixed=8))
    assert 60 + len(long.tokens) == verifier.max_seq and long.stop == "context"
    with pytest.raises(ValueError, match="context"):
        generate(list(range(VOCAB)) + list(range(40)), verifier, None, SessionParams(), 5)


def test_past_the_drafters_context_it_is_re_primed_on_the_streams_tail(models, tmp_path, backends):
    """A drafter whose context is full begins again on the stream's last tokens (host/decode/window.py): it
    never drafts past its context and drafts to the end; a prompt longer than its context starts it there."""
    verifier = backends[0]
    short = tmp_path / "short.spm"
    random_model(short, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, vocab=VOCAB, max_seq=24, seed=12)
    drafter = LocalDrafter(str(short))
    plain = generate([3, 4], verifier, None, SessionParams(), 60)
    res = generate([3, 4], verifier, drafter, SessionParams(), 60, GammaController(fixed=4))
    assert res.tokens == plain.tokens and len(res.tokens) == 60
    assert all(r.pos0 - r.base + r.gamma <= 24 - 1 for r in res.rounds)  # no draft beyond the drafter's context
    assert sum(1 for r in res.rounds if r.reprime) >= 2 and all(r.gamma for r in res.rounds[:-1])
    too_long = generate(list(range(30)), verifier, drafter, SessionParams(), 5, GammaController(fixed=4))
    assert too_long.tokens == generate(list(range(30)), verifier, None, SessionParams(), 5).tokens
    assert too_long.rounds[0].gamma and too_long.rounds[0].base == 30 - 24 // 4


def test_verifier_refuses_a_draft_for_the_wrong_position(backends):
    verifier, _, _ = backends
    verifier.begin(SessionParams(), [1, 2, 3])
    with pytest.raises(Exception, match="position 2"):
        verifier.verify([1, 2, 3], Draft(2, [4], [([4], [1 << 16])]))


def test_sampling_parameters_are_snapped_to_what_begin_carries():
    assert temp_milli(1.2345) == 1235 and temperature_from_milli(1235) == 1.235  # 1234.5: half up
    assert temp_milli(0.0005) == 1 and temp_milli(0.0) == 0 and temp_milli(65.535) == 65535
    assert top_p_q16(0.95) == 62259 and top_p_q16(1.0) == 65536
    assert SessionParams(top_p=0.95).top_p == 62259 / 65536 and SessionParams(top_p=0.95).top_p_q16 == 62259
    for m in range(0, 65536, 7):  # the float a back-end applies gives back the wire value
        assert temp_milli(temperature_from_milli(m)) == m


@pytest.mark.parametrize("call, message", [
    (lambda: temp_milli(0.0004), "rounds to 0"), (lambda: temp_milli(65.536), "outside"),
    (lambda: temp_milli(-0.1), "outside"), (lambda: temp_milli(float("nan")), "outside"),
    (lambda: top_p_q16(1e-6), "rounds to 0"), (lambda: top_p_q16(0.0), "outside"),
    (lambda: top_p_q16(1.5), "outside")])
def test_sampling_parameters_the_wire_cannot_carry_are_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


class CountingStops(StopStrings):
    """Stop strings that record how much text each search covers."""

    def __init__(self, stops):
        super().__init__(stops)
        self.searched = []

    def cut(self, text, start=0):
        self.searched.append(len(text) - start)
        return super().cut(text, start)


class PerRound(Watch):
    """The CLI's observer, recording per round: the tokens shown, and the decodes and text searched it took."""

    def __init__(self, scan, decodes):
        super().__init__(scan)
        self.decodes, self.rounds = decodes, []

    def shown(self, accepted, emitted):
        before, searched = len(self.decodes), len(self.scan.stops.searched)
        super().shown(accepted, emitted)
        self.rounds.append((len(accepted) + len(emitted), len(self.decodes) - before,
                            max(self.scan.stops.searched[searched:], default=0)))


def test_a_stop_string_check_costs_the_same_at_token_500_as_at_token_5(tmp_path):
    """The stop decision decodes each token once, as it arrives: a round decodes its own tokens only and
    searches the text they add (with the few characters before it a stop string could straddle), at the
    500th token as at the 5th; and a stop string first written there ends the stream there."""
    path = tmp_path / "long.spm"
    random_model(path, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, vocab=VOCAB, max_seq=640, seed=3)
    verifier, params = LocalVerifier(path), SessionParams()
    letters = [bytes([97 + t % 26]) for t in range(VOCAB)]  # each token one letter

    def run(stop):
        decodes = []
        watch = PerRound(StopScan(CountingStops([stop]), lambda t: decodes.append(t) or letters[t]), decodes)
        return generate([1, 2, 3], verifier, None, params, 520, observer=watch), watch

    result, watch = run("no such text")
    assert result.stop == "max_tokens" and len(result.tokens) == 520
    for token in (5, 500):  # plain rounds: one token each
        # one decode, and a search of the new letter and the 11 before it (fewer at the start)
        assert watch.rounds[token - 1] == (1, 1, min(token, len("no such text")))
    text = watch.finish()
    assert text == "".join(letters[t].decode() for t in result.tokens)
    stop = text[496:500]
    first = text.find(stop)
    assert 5 < first <= 496  # (a random model's text repeats: the stop string may first appear earlier)
    cut, watch = run(stop)
    assert cut.stop == "stop" and watch.finish() == text[:first]
    assert len(cut.tokens) == first + len(stop) and cut.tokens == result.tokens[:len(cut.tokens)]
    assert {(n, d) for n, d, _ in watch.rounds} == {(1, 1)} and max(s for _, _, s in watch.rounds) <= len(stop)
