"""Drafting ahead (host/decode/ahead.py): the two-state plan, the decode loop's drafts made beside a verify (the
next round's drafts after a drafting round's guess, a plain round's shadow block), which leave the text the
verifier's and spare the next round its drafter call, and the projection's pricing of both
(host/projection/rounds.py)."""

import pytest
from scripted_drafter import Scripted, random_target

from specmesh.host.backends import LocalDrafter, LocalVerifier, Pending, SessionParams
from specmesh.host.decode.ahead import Plan, expected_tokens, plan
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import Observer, Round, generate
from specmesh.host.projection.rounds import Projector
from specmesh.shared.modelfile import FLAG_SHARED_CLS, Header

PROMPT = [3, 1, 4, 1, 5]
GREEDY = SessionParams(temperature=0.0)
# an ESP32-S3 verifier's shape: v(k) = 0.67 + 0.33 k plain passes of 17 ms, and a drafter board's 4 ms call plus
# 2.2 ms a pass (host/projection: the classic ESP32's UART exchange and a 40-wide drafter's pass)
VERIFY = [0.0] + [0.017 * (0.67 + 0.33 * k) for k in range(1, 10)]
CALL, PASS = 0.004, 0.0022


def test_a_drafter_that_never_agrees_is_not_drafted_and_one_that_always_does_is_drafted_every_round():
    assert plan(0.05, VERIFY, CALL, PASS, 8) == Plan(1.0 / VERIFY[1])  # plain throughout
    always = plan(1.0, VERIFY, CALL, PASS, 8)
    assert always.ready == 8  # every block ready, as long as the verifier takes them
    assert always.rate == pytest.approx(9 / max(VERIFY[9], CALL + PASS * 9))


def test_behind_the_plan_decodes_plainly_beside_a_shadow_block_when_drafting_afresh_costs_more():
    slow_call = plan(0.8, VERIFY, 0.012, PASS, 8)  # a 12 ms exchange before every fresh block
    assert slow_call.ready > 0 and slow_call.behind == 0
    assert slow_call.shadow_block == slow_call.ready + 2 and slow_call.block == slow_call.ready + 1
    sampled = plan(0.8, VERIFY, 0.012, PASS, 8, shadows=False)  # no shadows: a fresh block it is
    assert sampled.behind > 0 and sampled.rate < slow_call.rate


def test_the_plan_beats_drafting_afresh_every_round():
    for alpha in (0.5, 0.7, 0.8, 0.9):
        p = plan(alpha, VERIFY, CALL, PASS, 8)
        fresh = max(expected_tokens(alpha, g) / (CALL + PASS * g + VERIFY[g + 1]) for g in range(1, 9))
        assert p.rate >= max(fresh, 1.0 / VERIFY[1])


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return random_target(tmp_path_factory.mktemp("models"))


class Counting(Scripted):
    """A scripted drafter that counts its calls and records when each was started and collected."""

    def __init__(self, path, agrees, log=None):
        super().__init__(path, agrees)
        self.calls = 0
        self.log = log if log is not None else []

    def draft(self, committed, gamma):
        self.calls += 1
        return super().draft(committed, gamma)

    def start_draft(self, committed, gamma):
        self.log.append("start")

        def made():
            self.log.append("collect")
            return self.draft(committed, gamma)
        return Pending(made)


class Logging(LocalVerifier):
    """A verifier that logs its calls and keeps the drafts it was sent, by position."""

    def __init__(self, path, log=None):
        super().__init__(path)
        self.log = log if log is not None else []
        self.sent: dict[int, list[int]] = {}

    def verify(self, committed, draft):
        self.log.append("verify")
        self.sent[draft.pos0] = list(draft.tokens)
        return super().verify(committed, draft)


def board_like(r: Round) -> tuple[float, float, float]:
    """The projection's kind of costs (known beforehand): a fresh call before the verify, none for ready drafts,
    a shadow's call."""
    passes = r.lag + (r.gamma + r.guessed if r.gamma else 1 + r.ahead)
    return (0.0 if r.ready else CALL + PASS * passes), VERIFY[r.gamma + 1], 0.0


def pipelined(fixed=None) -> GammaController:
    c = GammaController(fixed=fixed, copying=False)
    c.expect(0.9)
    c.pipelined = True
    return c


def test_drafts_made_ahead_leave_the_greedy_text_plain_and_spare_the_next_rounds_their_calls(target):
    plain = generate(PROMPT, LocalVerifier(target), None, GREEDY, 60).tokens
    agrees = lambda pos: pos % 9 != 4  # a miss now and then
    ahead, verifier = Counting(target, agrees), Logging(target)
    r = generate(PROMPT, verifier, ahead, GREEDY, 60, pipelined(), Observer(costs=board_like))
    assert r.tokens == plain
    ready = [x for x in r.rounds if x.ready]
    assert ready and all(x.gamma and x.guessed for x in ready)
    assert any(x.shadow and x.ahead for x in r.rounds)  # a shadow block after a miss
    assert all(prev.guess_hit or prev.shadow_hit for prev, x in zip(r.rounds, r.rounds[1:]) if x.ready)
    # a ready round made no drafter call before its verify: the drafter's calls are the fresh rounds' and the
    # calls beside the verifies
    fresh = sum(1 for x in r.rounds if x.gamma and not x.ready)
    beside = sum(1 for x in r.rounds if x.shadow or x.ahead)
    assert ahead.calls == fresh + beside
    # what a ready round verified is what the drafter drafts there afresh
    stream = PROMPT + r.tokens
    for x in ready:
        d = Scripted(target, agrees)
        d.begin(GREEDY, PROMPT)
        assert d.draft(stream[:x.pos0], x.gamma).tokens == verifier.sent[x.pos0]


@pytest.mark.parametrize("params", [GREEDY, SessionParams(seed=7, temperature=0.9)])
def test_a_fixed_gamma_drafts_the_same_text_with_drafting_ahead(target, params):
    want = generate(PROMPT, LocalVerifier(target), LocalDrafter(target), params, 40, GammaController(fixed=3)).tokens
    r = generate(PROMPT, LocalVerifier(target), LocalDrafter(target), params, 40, pipelined(fixed=3))
    assert r.tokens == want
    assert all(x.ahead == 4 for x in r.rounds[:-2] if x.gamma)  # the next 3 drafts and their guess beside each
    if not params.temperature:  # the drafter is the target: every guess is right, every later round ready
        assert all(x.ready for x in r.rounds[1:-1])


def test_the_call_beside_the_verify_starts_before_it_and_is_collected_after(target):
    log: list[str] = []
    r = generate(PROMPT, Logging(target, log), Counting(target, lambda pos: True, log), GREEDY, 12, pipelined(fixed=2))
    assert r.rounds[1].ready
    order = "".join({"start": "s", "verify": "v", "collect": "c"}[e] for e in log)
    assert "svc" in order  # the drafts ahead asked before the verify, made (on the host: collected) after it


DRAFTER = Header(32, 2, 4, 2, 96, 512, 256, flags=FLAG_SHARED_CLS)
TARGET = Header(64, 5, 8, 4, 172, 512, 512, flags=FLAG_SHARED_CLS)


def rnd(**kw) -> Round:
    base = dict(gamma=3, n_accepted=3, n_committed=4, pos0=40, draft_body=9, verify_body=9)
    return Round(**(base | kw))


def test_a_ready_round_waits_for_no_drafter_and_a_call_beside_the_verify_costs_what_it_overruns():
    p = Projector(TARGET, DRAFTER, "esp32s3", kernels="native")
    fresh, ready = rnd(guessed=True), rnd(guessed=True, ready=True)
    (d_fresh, v, over), (d_ready, v2, over2) = p.replay([fresh, ready])
    assert d_fresh > 0 and d_ready == 0 and over == over2 == 0 and v == v2
    assert d_fresh == pytest.approx(sum(p.draft_passes(40, 4)) + p.draft_call(fresh))  # the drafts and the guess
    beside = rnd(guessed=True, ready=True, ahead=4, ahead_body=11)
    assert p.ahead_seconds(beside) < p.verify_seconds(beside)  # hidden by the verify
    (d, _, over), = p.replay([beside])
    assert d == over == 0
    long = rnd(guessed=True, ready=True, ahead=40, ahead_body=83)  # a block longer than the verify
    (d, v, over), = p.replay([long])
    assert over == pytest.approx(p.ahead_seconds(long) - v) and d == over > 0
    shadow = Round(gamma=0, n_accepted=0, n_committed=1, pos0=40, draft_body=2, verify_body=2, shadow=True,
                   shadow_body=9, ahead=3)
    assert p.shadow_seconds(shadow) > p.shadow_seconds(Round(**(shadow.__dict__ | {"ahead": 0, "shadow_body": 5})))
    assert p.round_bytes(beside)["drafter"] > 0 and p.round_bytes(ready)["drafter"] == 0
