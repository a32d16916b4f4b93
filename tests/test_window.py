"""The drafter's sliding window (host/decode/window.py): a stream longer than the drafter's context keeps
drafting after the context fills, on the host engine and on a virtual drafter board; greedy text is plain
decoding's, sampled text one across back-ends for a seed; gamma auto keeps speculating; the projection charges
each re-prime to the drafter."""

from pathlib import Path

import pytest

from specmesh.host.backends import Draft, LocalDrafter, LocalVerifier, SessionParams
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import Observer, Round, generate
from specmesh.host.decode.tokenizer import Tokenizer
from specmesh.host.decode.window import Window, window_seed
from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.host.projection.rounds import Projector, begin_body
from specmesh.shared.modelfile import parse_header
from specmesh.tools.testmodels import with_context

MODELS = Path(__file__).resolve().parent.parent / "models"
CTX = 48  # the drafter's context in these tests: a 120-token stream re-primes it several times


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The shipped target and the classic ESP32's shipped drafter cut to CTX positions (drafter.spm)."""
    d = tmp_path_factory.mktemp("window")
    (d / TARGET_FILE).symlink_to(MODELS / TARGET_FILE)
    with_context(MODELS / "drafter-esp32.spm", d / DRAFTER_FILE, CTX)
    return d


@pytest.fixture(scope="module")
def prompt():
    return Tokenizer.from_llama2c(MODELS / "tokenizer.bin").encode("Once upon a time")


def after_refill(rounds: list[Round]) -> list[Round]:
    first = next(i for i, r in enumerate(rounds) if r.reprime)
    return rounds[first:]


def tokens_per_verification(rounds: list[Round]) -> float:
    return sum(r.n_committed for r in rounds) / len(rounds)


def test_the_window_moves_only_when_it_makes_room_and_each_window_drafts_under_its_own_seed():
    w = Window(32)
    assert w.keep == 8 and w.start(list(range(10))) == list(range(10)) and w.base == 0
    assert not w.full(23, 8) and w.full(24, 8)  # 8 drafts after 24 tokens pass position 31
    assert w.move(list(range(24))) == list(range(16, 24)) and (w.base, w.room(24), w.moves) == (16, 23, 1)
    assert not w.full(24, 8) and w.draft(Draft(8, [1], [([1], [1])])).pos0 == 24
    small = Window(10)  # keep 2: room 7 after a move, so at 2 tokens held a move makes no room
    assert not small.full(2, 8) and small.full(3, 8)
    long = Window(32)
    assert long.start(list(range(40))) == list(range(32, 40)) and long.base == 32
    params = SessionParams(seed=7, temperature=0.8)
    assert Window(32).params(params) is params  # the first window drafts under the stream's seed
    seeds = {window_seed(7, b) for b in range(0, 5000, 17)}
    assert len(seeds) == len(range(0, 5000, 17)) and window_seed(7, 0) == 7
    assert long.params(params).seed == window_seed(7, 32) and long.params(params).temperature == params.temperature


def test_past_the_drafters_context_it_keeps_drafting_and_the_text_is_plain_decodings(models, prompt):
    verifier, drafter = LocalVerifier(models / TARGET_FILE), LocalDrafter(models / DRAFTER_FILE)
    params = SessionParams()
    plain = generate(prompt, verifier, None, params, 120)
    res = generate(prompt, verifier, drafter, params, 120, GammaController(fixed=4))
    assert res.tokens == plain.tokens and len(res.tokens) == 120
    assert sum(1 for r in res.rounds if r.reprime) >= 3
    assert all(r.pos0 - r.base + r.gamma <= CTX - 1 for r in res.rounds)  # no draft past the drafter's context
    late = after_refill(res.rounds)
    assert all(r.gamma == 4 for r in late[:-2]) and tokens_per_verification(late) > 2.5


def test_gamma_auto_keeps_speculating_after_the_refill(models, prompt):
    """With known costs where drafting pays (a projection's), every round after the first re-prime drafts."""
    verifier, drafter = LocalVerifier(models / TARGET_FILE), LocalDrafter(models / DRAFTER_FILE)
    costs = Observer(costs=lambda r: (0.002 * r.gamma + 0.02 * r.reprime, 0.02 + 0.004 * r.gamma, 0.0))
    params = SessionParams()
    res = generate(prompt, verifier, drafter, params, 120, observer=costs)
    assert res.tokens == generate(prompt, verifier, None, params, 120).tokens
    late = after_refill(res.rounds)
    assert sum(1 for r in res.rounds if r.reprime) >= 2
    assert all(r.gamma for r in late[:-1]) and tokens_per_verification(late) > 2.5


def test_a_board_drafter_re_primes_through_begin_and_drafts_what_the_host_drafter_drafts(models, prompt, tmp_path):
    """A virtual drafter board (BEGIN with the window as its prompt) proposes exactly what the host engine does
    in each window, greedy and sampled (each window's seed, the firmware's PRNG): one text for a seed."""
    from specmesh.host.provision.cluster import Cluster

    verifier, cpu = LocalVerifier(models / TARGET_FILE), LocalDrafter(models / DRAFTER_FILE)
    projector = Projector(*(parse_header((models / f).read_bytes()[:64]) for f in (TARGET_FILE, DRAFTER_FILE)))
    with Cluster("serial", models, tmp_path) as c:
        board = c.backend("drafter")
        assert board.max_seq == CTX
        compared = 0
        for params in (SessionParams(), SessionParams(seed=11, temperature=0.8, draft_top_k=6)):
            resent = board.proxy.bus.retransmits
            res = generate(prompt, verifier, board, params, 90, GammaController(fixed=3))
            resent = board.proxy.bus.retransmits - resent  # (a frame resent under load: bytes no model prices)
            assert sum(1 for r in res.rounds if r.reprime) >= 2 and res.rounds[-1].base > 0
            assert res.tokens == generate(prompt, verifier, cpu, params, 90, GammaController(fixed=3)).tokens
            if params.greedy:
                assert res.tokens == generate(prompt, verifier, None, params, 90).tokens
            assert tokens_per_verification(after_refill(res.rounds)) > 1.5
            if not resent:  # the projection's bytes on the drafter's link are the measured ones, re-primes' BEGIN too
                for r in res.rounds[1:]:
                    assert projector.round_bytes(r)["drafter"] == r.bytes_draft, r
                compared += 1
        assert compared > 0


def test_the_projection_charges_a_re_prime_to_the_drafter(models):
    """A re-primed round costs the drafter one pass per prefilled position (at the new window's positions) and,
    on a board, the BEGIN exchange that carries the window; its drafts are priced at the window's positions."""
    target, drafter = (parse_header((models / f).read_bytes()[:64]) for f in (TARGET_FILE, DRAFTER_FILE))
    shape = {"gamma": 4, "n_accepted": 4, "n_committed": 5, "pos0": 200, "draft_body": 7, "verify_body": 7}
    kept, moved = Round(**shape, base=188), Round(**shape, base=188, reprime=12)
    for on_host in (False, True):
        p = Projector(target, drafter, drafter_on_host=on_host)
        prefill = sum(p.draft_passes(0, 11))
        extra = p.round_costs(moved)[0] - p.round_costs(kept)[0]
        assert extra == pytest.approx(prefill) if on_host else extra > prefill
        assert p.round_costs(kept)[0] < p.round_costs(Round(**shape))[0] or on_host  # shorter context, cheaper
    board = Projector(target, drafter)
    assert (board.round_bytes(moved)["drafter"] - board.round_bytes(kept)["drafter"]
            >= board.exchange("drafter", begin_body(12), 0) - 4)
