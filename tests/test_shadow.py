"""Shadow drafts (host/decode/gamma.py, host/decode/orchestrator.py): in a plain greedy round the drafter drafts
the position the verifier decides, and its hit or miss is acceptance evidence at no verifier cost. The text is
the verifier's alone; a drafter that never agrees is not probed, one that starts agreeing is drafted again."""

import pytest
from scripted_drafter import Scripted, random_target

from specmesh.host.backends import LocalVerifier, SessionParams
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import Observer, Round, generate

PROMPT = [3, 1, 4, 1, 5]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return random_target(tmp_path_factory.mktemp("models"))


def s3(r: Round) -> tuple[float, float, float]:
    """An ESP32-S3 verifier's shape of costs (v(k) = 0.67 + 0.33k plain steps of 21 ms) and a 1.3 ms drafter
    call plus 0.1 ms a pass: known beforehand, as under --project."""
    passes = r.lag + (r.gamma or r.shadow)
    return ((0.0013 + 0.0001 * passes) if passes else 0.0), 0.021 * (0.67 + 0.33 * (r.gamma + 1)), 0.0


def run(target, agrees, n=64, params=SessionParams(temperature=0.0)):
    # Beta(1, 1): a measured prior (expect) is worth PRIOR_WEIGHT misses more before plain; no copied drafts
    # (tests/test_lookup.py): the plain rounds here are the shadows' alone
    c = GammaController(copying=False)
    return generate(PROMPT, LocalVerifier(target), Scripted(target, agrees), params, n, c, Observer(costs=s3))


def test_a_drafter_that_never_agrees_is_hardly_drafted_and_the_text_is_plain(target):
    plain = generate(PROMPT, LocalVerifier(target), None, SessionParams(temperature=0.0), 64)
    r = run(target, lambda pos: False)
    assert r.tokens == plain.tokens
    assert sum(1 for x in r.rounds if x.gamma) <= 2  # the prior's first try at most: the shadows' evidence
    assert r.shadows >= 60 and r.shadow_hits == 0
    assert all(x.lag == 0 for x in r.rounds)  # the drafter stayed in step: no catch-up


def test_a_drafter_that_starts_agreeing_is_drafted_again_from_shadow_evidence(target):
    start = len(PROMPT) + 20
    r = run(target, lambda pos: pos >= start, n=80)
    plain = generate(PROMPT, LocalVerifier(target), None, SessionParams(temperature=0.0), 80)
    assert r.tokens == plain.tokens
    late = [x for x in r.rounds if x.pos0 >= start]
    early_drafting = [x for x in r.rounds if x.gamma and 8 <= x.pos0 - len(PROMPT) and x.pos0 < start]
    assert not early_drafting  # while it disagreed: no probe
    back = next(i for i, x in enumerate(late) if x.gamma)
    assert back <= 8 and all(x.shadow for x in late[:back])  # the shadow hits turned it back on
    assert all(x.gamma for x in late[back:-1])  # and it stays on (the last round may have no room to draft)


def test_sampled_runs_have_no_shadow_drafts(target):
    params = SessionParams(seed=3, temperature=0.8)
    r = run(target, lambda pos: True, params=params)  # (a scripted miss would not be the drafter's q-hat)
    assert r.shadows == 0 and r.rounds[0].gamma == 0 and r.rounds[1].gamma > 0  # the opening probe, as before


def test_a_shadow_draft_costs_a_plain_round_only_what_the_verify_does_not_hide():
    from specmesh.host.projection.rounds import Projector
    from specmesh.host.layout import DRAFTER_FILE, MODELS, TARGET_FILE
    from specmesh.shared.modelfile import HEADER_SIZE, parse_header

    def header(name):
        return parse_header((MODELS / name).read_bytes()[:HEADER_SIZE])

    proj = Projector(header(TARGET_FILE), header(DRAFTER_FILE), "esp32s3", drafter_board="esp32")
    plain = Round(gamma=0, n_accepted=0, n_committed=1, pos0=20, draft_body=3, verify_body=3)
    shadow = Round(gamma=0, n_accepted=0, n_committed=1, pos0=20, draft_body=3, verify_body=3, shadow=True,
                   shadow_body=5)
    [(d0, v0, _)], [(d1, v1, _)] = proj.replay([plain]), proj.replay([shadow])
    assert d0 == 0.0 and v1 == v0 and 0.0 < proj.shadow_seconds(shadow)
    assert d1 == max(0.0, proj.shadow_seconds(shadow) - v0)  # concurrent with the verify, on its own link
    assert proj.round_bytes(shadow)["drafter"] > 0 == proj.round_bytes(plain)["drafter"]
