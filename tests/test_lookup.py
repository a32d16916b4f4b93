"""Context-lookup drafts (host/decode/lookup.py): a greedy stream's plain rounds verify tokens copied from its
drafter's n-gram table or its own history when the gamma controller says they pay. The text stays the plain run's,
the drafter's alpha counts its own drafts only, a copied round is priced without the drafter, and sampled or
fixed-gamma runs copy nothing."""

import io

import pytest
from scripted_drafter import Scripted, random_target

from specmesh.host.backends import LocalVerifier, SessionParams
from specmesh.host.decode.gamma import TABLE, TEXT, GammaController
from specmesh.host.decode.lookup import MIN_MATCH, continuation, table_continuation
from specmesh.host.decode.orchestrator import Observer, Round, generate
from specmesh.host.projection.rounds import PLAIN_BODY, Projector
from specmesh.shared import messages as m
from specmesh.shared import ngram
from specmesh.tools import ngram as builder
from specmesh.shared.modelfile import FLAG_SHARED_CLS, Header

PROMPT = [3, 1, 4, 1, 5]
GREEDY = SessionParams(temperature=0.0)


def test_the_longest_suffix_seen_before_gives_what_followed_its_latest_occurrence():
    assert continuation([1, 2, 3, 9, 1, 2, 3, 7, 5, 2, 3], 2) == [7, 5]  # "2 3" last followed by 7 5 ...
    assert continuation([1, 2, 3, 9, 5, 2, 3, 7, 1, 2, 3], 3) == [9, 5, 2]  # ... but "1 2 3" by 9 5 2
    assert continuation([4, 5, 6, 4, 5], 8) == [6, 4, 5]  # as many as followed, up to the stream's end
    assert continuation([4, 5, 6, 4, 5], 1) == [6]


def test_no_copy_without_a_repeat_of_the_shortest_match():
    assert continuation([1, 2, 3, 4, 5], 4) == []
    assert continuation([7, 1, 8, 7], 4) == []  # one token matched is too weak a cue (MIN_MATCH)
    assert MIN_MATCH == 2 and continuation([7, 1, 8, 9, 7, 1], 2) == [8, 9]
    assert continuation([1, 2, 1, 2], 0) == [] and continuation([], 3) == []


def _known(verify):
    """A controller primed with known costs: `verify(k)` seconds for k positions, a 5 ms drafter call."""
    c = GammaController()
    c.prime(lambda g: (0.005 if g else 0.0, verify(g + 1), 0.0))
    return c


def test_copies_pay_where_a_position_costs_less_than_a_round_and_never_on_fixed_gamma():
    bus_bound = _known(lambda k: 0.010 + 0.002 * k)  # a verify mostly its round trip: copies pay
    assert bus_bound.lookup_length(6) >= 2
    assert _known(lambda k: 0.010 * k).lookup_length(6) == 0  # each position a whole pass: no copy pays
    assert GammaController(fixed=0).lookup_length(6) == 0
    off = _known(lambda k: 0.010 + 0.002 * k)
    off.copying = False
    assert off.lookup_length(6) == 0


def test_copies_that_keep_missing_stop_being_sent():
    c = _known(lambda k: 0.010 + 0.004 * k)
    first = c.lookup_length(6)
    assert first >= 1
    for _ in range(10):  # each copied round rejected at its first draft
        c.observe(first, 0, 0.0, 0.010 + 0.004 * (first + 1), 0.0, lookup=TEXT)
    assert c.lookup_length(6) == 0
    assert c.alpha == pytest.approx(c.prior_alpha)  # the drafter's own estimate heard nothing of them
    assert c.lookup_length(6, TABLE) == first  # nor the table's copies: each source is judged on its own


def test_where_the_tables_copies_keep_missing_the_text_is_copied_instead():
    """A stream that repeats itself, where the target's table leads elsewhere: the table's copies come first (its
    prior is the higher), and once they have failed the stream's own copies are sent instead."""
    c = _known(lambda k: 0.010 + 0.004 * k)
    source, first = c.lookup_pick({TABLE: 6, TEXT: 6})
    assert source == TABLE and first >= 2
    sources = []
    for _ in range(4):  # each copied round rejected at its first draft if it came from the table, else all accepted
        source, k = c.lookup_pick({TABLE: 6, TEXT: 6})
        c.observe(k, k if source == TEXT else 0, 0.0, 0.010 + 0.004 * (k + 1), 0.0, lookup=source)
        sources.append(source)
    assert sources[0] == TABLE and sources[-2:] == [TEXT, TEXT]
    assert c.lookup_pick({TABLE: 6})[1] < first  # the table alone: shorter copies
    assert c.lookup_pick({}) == ("", 0)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return random_target(tmp_path_factory.mktemp("models"))


def wrong(target: str) -> Scripted:
    """A drafter whose every first draft is a token the target does not pick there."""
    return Scripted(target, lambda pos: False)


def bus_bound(r: Round) -> tuple[float, float, float]:
    """Known costs where a verify is mostly its round trip (v(k) = 0.8 + 0.2k): copies pay."""
    passes = r.lag + (r.drafter_drafts or r.shadow)
    return ((0.0013 + 0.0001 * passes) if passes else 0.0), 0.021 * (0.8 + 0.2 * (r.gamma + 1)), 0.0


def test_a_looping_stream_verifies_copies_and_keeps_the_plain_text(target):
    plain = generate(PROMPT, LocalVerifier(target), None, GREEDY, 96)
    r = generate(PROMPT, LocalVerifier(target), wrong(target), GREEDY, 96, GammaController(),
                 Observer(costs=bus_bound))
    assert r.tokens == plain.tokens
    assert r.lookups > 0 and r.lookup_accepted > 0  # the random target repeats itself; the copies follow it
    copied = [x for x in r.rounds if x.lookup]
    assert all(x.drafter_drafts == 0 for x in copied)  # the drafter drafted none of them
    # beside their verify it shadows as in any plain round (its hit: the first token committed), so it stays in step
    assert any(x.shadow for x in copied) and all(x.lag == 0 for x in r.rounds)
    # the drafter's alpha is its own drafts' (every one rejected), not the copies'
    assert r.accepted == 0 and r.alpha in (None, 0.0)
    assert r.lookup_drafts == sum(x.gamma for x in copied)
    assert sum(r.gamma_hist.values()) == len(r.rounds) and r.gamma_hist.get(0, 0) >= len(copied)


def test_a_table_chain_is_its_tokens_while_it_holds_one():
    table = ngram.Table(io.BytesIO(builder.table_bytes({(1, 2): 3, (2, 3): 4, (3, 4): 9}, 2, 4)))
    assert table_continuation(table, [0, 1, 2], 5) == [3, 4, 9]  # then (4, 9) is not held
    assert table_continuation(table, [0, 1, 2], 2) == [3, 4]
    assert table_continuation(table, [7, 7], 5) == []


def test_copies_come_from_the_targets_table_first_and_keep_the_plain_text(target):
    """A drafter whose `copies` is a table of the target's own continuations (the target's beside a drafter with a
    table of its own): plain rounds verify the table's chain before any copy of the stream's history."""
    plain = generate(PROMPT, LocalVerifier(target), None, GREEDY, 96)
    seq = PROMPT + plain.tokens
    seen: dict[tuple[int, ...], set[int]] = {}
    for i in range(len(PROMPT), len(seq)):
        seen.setdefault(tuple(seq[i - 3:i]), set()).add(seq[i])
    entries = {c: next(iter(t)) for c, t in seen.items() if len(t) == 1}  # contexts the target continued one way
    history = generate(PROMPT, LocalVerifier(target), wrong(target), GREEDY, 96, GammaController(),
                       Observer(costs=bus_bound))
    drafter = wrong(target)
    drafter.copies = ngram.Table(io.BytesIO(builder.table_bytes(entries, 3, 3, reach=len(seq))))
    r = generate(PROMPT, LocalVerifier(target), drafter, GREEDY, 96, GammaController(), Observer(costs=bus_bound))
    assert r.tokens == plain.tokens
    assert r.lookup_accepted > history.lookup_accepted
    first = next(x for x in r.rounds if x.lookup)  # its drafts: the table's chain from the stream there
    chain = table_continuation(drafter.copies, seq[:first.pos0], 96)
    assert len(chain) >= first.gamma and seq[first.pos0:first.pos0 + first.n_accepted] == chain[:first.n_accepted]


def test_sampled_and_fixed_gamma_runs_copy_nothing(target):
    sampled = generate(PROMPT, LocalVerifier(target), wrong(target), SessionParams(seed=3, temperature=0.8), 64,
                       GammaController(), Observer(costs=bus_bound))
    fixed = generate(PROMPT, LocalVerifier(target), wrong(target), GREEDY, 64, GammaController(fixed=0),
                     Observer(costs=bus_bound))
    assert sampled.lookups == 0 and fixed.lookups == 0


def test_a_copied_round_costs_its_verify_and_no_drafter_time():
    target = Header(128, 6, 4, 2, 352, 512, 256, flags=FLAG_SHARED_CLS)
    drafter = Header(32, 2, 4, 2, 96, 512, 256, flags=FLAG_SHARED_CLS)
    p = Projector(target, drafter, "esp32s3")
    entries = [(7, [7], [m.ONE])] * 3
    body = dict(draft_body=len(m.pack_draft(20, entries)), verify_body=len(m.pack_draft(20, entries, partial=True)))
    drafted = Round(gamma=3, n_accepted=3, n_committed=4, pos0=20, **body)
    copied = Round(gamma=3, n_accepted=3, n_committed=4, pos0=20, lookup=TEXT, **body)
    plain = Round(gamma=0, n_accepted=0, n_committed=1, pos0=20, draft_body=PLAIN_BODY, verify_body=PLAIN_BODY)
    assert p.round_costs(copied) == (0.0, p.round_costs(drafted)[1], 0.0)
    assert p.round_costs(drafted)[0] > 0.0 and p.round_costs(copied)[1] > p.round_costs(plain)[1]
    assert p.round_bytes(copied)["drafter"] == 0 and p.round_bytes(drafted)["drafter"] > 0
