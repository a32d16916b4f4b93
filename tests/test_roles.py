"""Drafter and verifier nodes under the real `micropython` binary, checked against the numpy reference
engine (host/backends/engine.py) and the shared acceptance rule computed here, through commits and rollbacks."""

from __future__ import annotations

import numpy as np
import pytest

from specmesh.host.backends.engine import Engine, draft_table, target_table
from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.tools.nodeproc import NodeProc, begin, commit, generate
from specmesh.shared import messages as m
from specmesh.shared import rule
from specmesh.shared.prng import DRAFT
from specmesh.tools.testmodels import random_model

MAX_SEQ = 48
VOCAB = 96


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("models")
    random_model(d / TARGET_FILE, dim=32, n_layers=2, vocab=VOCAB, max_seq=MAX_SEQ, seed=11)
    random_model(d / DRAFTER_FILE, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, vocab=VOCAB,
                 max_seq=MAX_SEQ, seed=12)
    return {k: str(d / (k + ".spm")) for k in ("target", "drafter")}


def start(micropython, path, role: int, model: str, **cfg) -> NodeProc:
    config = {"node_id": 1, "role": ("idle", "drafter", "verifier")[role], "model": model}
    config.update(cfg)
    n = NodeProc(micropython, path, config)
    assert n.call(m.HELLO)[2] == role, n.text
    return n


@pytest.fixture
def verifier(micropython, tmp_path, models):
    n = start(micropython, tmp_path / "verifier", m.ROLE_VERIFIER, models["target"])
    yield n
    n.close()


@pytest.fixture
def drafter(micropython, tmp_path, models):
    n = start(micropython, tmp_path / "drafter", m.ROLE_DRAFTER, models["drafter"])
    yield n
    n.close()


def qhat(eng: Engine, tokens: list[int], temp: float, k: int) -> tuple[list[int], list[int]]:
    return draft_table(eng.forward(tokens, 0)[-1], round(temp * 1000), k)


def test_verifier_verdicts_equal_numpy_engine_and_shared_rule(verifier, models):
    """Sampling mode with target top-k and top-p, gamma 0..4, commits and a rollback: every verdict equals
    the rule applied to the numpy engine's target tables over the same sequence."""
    target = Engine(models["target"])
    draft_eng = Engine(models["drafter"])
    temp, top_k, top_p, seed = 0.9, 40, 0.95, 1234
    tokens = [5, 17, 33, 2]
    begin(verifier, 1, seed, temp, tokens, top_k=top_k, top_p=top_p)
    rng = np.random.default_rng(0)
    accepted = rounds = 0
    for step in range(14):
        gamma = step % 5
        L = len(tokens)
        entries = []
        for i in range(gamma):  # the drafter's q-hat, sampled as the drafter would
            ids, weights = qhat(draft_eng, tokens + [e[0] for e in entries], temp, 8)
            entries.append((rule.sample_sparse(ids, weights, seed, L + i, DRAFT), ids, weights))
        acc, tok = verifier.call(m.VERIFY_REQ, m.pack_draft(L, entries), expect=m.VERDICT)
        drafts = [e[0] for e in entries]
        rows = target.forward(tokens + drafts, 0)[L - 1:]
        p_tables = [target_table(r, round(temp * 1000), top_k, round(top_p * 65536)) for r in rows]
        want = rule.verify(p_tables, drafts, [(e[1], e[2]) for e in entries], seed, L, -1)
        assert (acc, tok) == want, "step %d" % step
        accepted += acc
        rounds += gamma > 0
        tokens += drafts[:acc] + [tok]  # the verdict commits itself: no COMMIT
        if step == 8:  # the host rolls the stream back a few tokens
            cut = len(tokens) - int(rng.integers(1, 4))
            verifier.call(m.ROLLBACK, m.pack_rollback(cut), expect=m.ACK)
            del tokens[cut:]
    st = verifier.stats()
    assert st["accepted"] == accepted and st["verified"] == sum(s % 5 for s in range(14))
    assert st["committed"] == len(tokens)


def test_partial_tables_get_the_whole_tables_verdicts_and_a_rejection_costs_no_second_pass(verifier, models):
    """Drafts sent with their own q-hat weight only: each verdict is the rule's on the whole tables; at a
    rejection the verdict is PARTIAL, and the rejected draft's whole table gets the residual from the
    table the node kept (no second forward pass); the verdicts commit themselves."""
    target = Engine(models["target"])
    draft_eng = Engine(models["drafter"])
    temp, seed = 1.5, 4321
    tokens = [5, 17, 33, 2]
    begin(verifier, 7, seed, temp, tokens)
    asked = 0
    for _ in range(10):
        L = len(tokens)
        entries = []
        for i in range(3):
            ids, weights = qhat(draft_eng, tokens + [e[0] for e in entries], temp, 8)
            entries.append((rule.sample_sparse(ids, weights, seed, L + i, DRAFT), ids, weights))
        drafts = [e[0] for e in entries]
        rows = target.forward(tokens + drafts, 0)[L - 1:]
        want = rule.verify([target_table(r, round(temp * 1000), 0, 65536) for r in rows], drafts,
                           [(e[1], e[2]) for e in entries], seed, L, -1)
        acc, tok = verifier.call(m.VERIFY_REQ, m.pack_draft(L, entries, partial=True), expect=m.VERDICT)
        if tok == rule.PARTIAL:
            asked += 1
            passes = verifier.stats()["passes"]
            more, tok = verifier.call(m.VERIFY_REQ, m.pack_draft(L + acc, entries[acc:acc + 1]), expect=m.VERDICT)
            assert more == 0 and verifier.stats()["passes"] == passes
        assert (acc, tok) == want
        tokens += drafts[:acc] + [tok]
    assert asked and verifier.stats()["committed"] == len(tokens)
    # the whole table must hold the weight the draft was rejected with: the least likely token, drafted
    # with weight ONE - 1, is rejected (p(x) << q(x)); a table giving it another weight is refused
    L = len(tokens)
    p = target_table(target.forward(tokens, 0)[-1], round(temp * 1000), 0, 65536)
    x = min(range(VOCAB), key=lambda t: p[t])
    y = (x + 1) % VOCAB
    ids = sorted([x, y])
    table = [(x, ids, [rule.ONE - 1 if t == x else 1 for t in ids])]
    assert verifier.call(m.VERIFY_REQ, m.pack_draft(L, table, partial=True), expect=m.VERDICT) == (0, rule.PARTIAL)
    other = [(x, ids, [rule.ONE - 2 if t == x else 2 for t in ids])]
    assert verifier.error(m.VERIFY_REQ, m.pack_draft(L, other))[0] == 1  # E_MESSAGE
    assert verifier.call(m.VERIFY_REQ, m.pack_draft(L, table, partial=True), expect=m.VERDICT) == (0, rule.PARTIAL)
    assert verifier.call(m.VERIFY_REQ, m.pack_draft(L, table), expect=m.VERDICT) == rule.verify(
        [p, p], [x], [(ids, table[0][2])], seed, L, -1)


def test_greedy_verifier_matches_numpy_argmax(verifier, models):
    target = Engine(models["target"])
    tokens = [9, 8, 7]
    begin(verifier, 2, 0, 0.0, tokens)
    for _ in range(6):
        L = len(tokens)
        guess = [int(np.argmax(target.forward(tokens, 0)[-1])), 3]  # one right draft, one (likely) wrong
        entries = [(t, [t], [rule.ONE]) for t in guess]
        acc, tok = verifier.call(m.VERIFY_REQ, m.pack_draft(L, entries), expect=m.VERDICT)
        rows = target.forward(tokens + guess, 0)[L - 1:]
        assert (acc, tok) == rule.verify_greedy([int(np.argmax(r)) for r in rows], guess, -1)
        new = guess[:acc] + [tok]
        tokens += new
        if acc == 0:  # an explicit COMMIT of what the verdict committed already changes nothing
            commit(verifier, tokens, len(new))


def test_drafter_samples_each_draft_from_the_qhat_it_sends(drafter, models):
    ref = Engine(models["drafter"])
    temp, k, seed = 0.8, 6, 77
    tokens = [1, 2, 3, 4, 5]
    begin(drafter, 3, seed, temp, tokens, draft_k=k)
    tail = []
    for accept in (1, 4, 0):
        L = len(tokens)
        pos0, entries = drafter.call(m.DRAFT_REQ, m.pack_draft_req(L, 4, tail), expect=m.DRAFT)
        assert pos0 == L and len(entries) == 4
        seq = list(tokens)
        for i, (tok, ids, weights) in enumerate(entries):
            assert sum(weights) == rule.ONE and len(ids) <= k and ids == sorted(ids) and min(weights) > 0
            assert tok == rule.sample_sparse(ids, weights, seed, L + i, DRAFT)
            want_ids, want_w = qhat(ref, seq, temp, k)
            assert ids == want_ids
            assert max(abs(a - b) for a, b in zip(weights, want_w)) <= 64  # int8 engine vs numpy: 0.1 %
            seq.append(tok)
        # accept some drafts, then a token of the host's choice (a residual or a bonus)
        # the next DRAFT_REQ commits them: the drafter holds its accepted drafts, so only that token travels
        tail = [(entries[accept][0] + 1) % VOCAB if accept < 4 else 0]
        tokens += [e[0] for e in entries[:accept]] + tail
    drafter.call(m.COMMIT, m.pack_commit(len(tokens), tail), expect=m.ACK)
    st = drafter.stats()
    assert st["drafted"] == 12 and st["committed"] == len(tokens)


def test_greedy_drafts_are_the_drafter_models_argmax(drafter, models):
    ref = Engine(models["drafter"])
    tokens = [40, 41]
    begin(drafter, 4, 5, 0.0, tokens)
    _, entries = drafter.call(m.DRAFT_REQ, m.pack_draft_req(2, 5), expect=m.DRAFT)
    seq = list(tokens)
    for tok, ids, weights in entries:
        assert (ids, weights) == ([tok], [rule.ONE])
        assert tok == int(np.argmax(ref.forward(seq, 0)[-1]))
        seq.append(tok)


def test_drafter_prefills_the_prompt_at_begin_so_a_draft_feeds_only_new_positions(drafter):
    tokens = [7, 8, 9, 10, 11, 12]
    before = drafter.stats()["positions"]
    begin(drafter, 6, 1, 0.0, tokens)
    assert drafter.stats()["positions"] - before == len(tokens) - 1  # all but the last, which a draft feeds
    drafter.call(m.DRAFT_REQ, m.pack_draft_req(len(tokens), 2), expect=m.DRAFT)
    assert drafter.stats()["positions"] - before == len(tokens) + 1


def test_hello_reports_the_largest_gamma_each_node_accepts(micropython, tmp_path, models, drafter):
    assert drafter.call(m.HELLO)[8] == m.MAX_GAMMA
    v = start(micropython, tmp_path / "small", m.ROLE_VERIFIER, models["target"], kmax=5)
    try:
        assert v.call(m.HELLO)[8] == 4  # 4 drafts and the last committed token fill its pass of 5
        begin(v, 1, 1, 0.0, [3, 4])
        assert v.error(m.VERIFY_REQ, m.pack_draft(2, [(5, [5], [rule.ONE])] * 5))[0] == m.E_RANGE
        n_accepted, token = v.call(m.VERIFY_REQ, m.pack_draft(2, [(5, [5], [rule.ONE])] * 4), expect=m.VERDICT)
        assert 0 <= n_accepted <= 4 and token >= 0
    finally:
        v.close()
    begin(drafter, 9, 1, 0.0, [3, 4])
    assert drafter.error(m.DRAFT_REQ, m.pack_draft_req(2, m.MAX_GAMMA + 1))[0] == m.E_RANGE


def test_draft_block_stops_after_eos(drafter, models):
    ref = Engine(models["drafter"])
    tokens = [40, 41]
    eos = int(np.argmax(ref.forward(tokens + [int(np.argmax(ref.forward(tokens, 0)[-1]))], 0)[-1]))
    begin(drafter, 5, 5, 0.0, tokens, eos=eos)
    _, entries = drafter.call(m.DRAFT_REQ, m.pack_draft_req(2, 6), expect=m.DRAFT)
    assert [e[0] for e in entries][-1] == eos and len(entries) <= 2


def test_greedy_speculation_through_nodes_equals_plain_decoding(micropython, tmp_path, models, verifier, drafter):
    prompt = [3, 1, 4, 1, 5]
    plain = generate(drafter, verifier, prompt, 30, 0, 0.0, 0, 1, MAX_SEQ)
    assert generate(drafter, verifier, prompt, 30, 3, 0.0, 0, 2, MAX_SEQ) == plain
    # self-speculation (the target drafts for itself): every draft is accepted, and the same text comes out
    selfd = start(micropython, tmp_path / "self", m.ROLE_DRAFTER, models["target"])
    try:
        st0 = verifier.stats()
        assert generate(selfd, verifier, prompt, 30, 4, 0.0, 0, 3, MAX_SEQ) == plain
        st = verifier.stats()
        assert st["accepted"] - st0["accepted"] == st["verified"] - st0["verified"] > 0
    finally:
        selfd.close()


def test_pipelined_drafting_changes_timing_not_tokens(micropython, tmp_path, models, verifier):
    """A drafter that drafts ahead while the verdict is pending sends exactly the drafts it would have
    computed on request: the generated text is identical, and drafts made ahead get used."""
    prompt = [7, 7, 2]
    plain = start(micropython, tmp_path / "plain", m.ROLE_DRAFTER, models["target"])
    ahead = start(micropython, tmp_path / "ahead", m.ROLE_DRAFTER, models["target"], spec_ahead=8)
    try:
        want = generate(plain, verifier, prompt, 28, 3, 0.8, 99, 1, MAX_SEQ)
        assert generate(ahead, verifier, prompt, 28, 3, 0.8, 99, 2, MAX_SEQ, pause=0.02) == want
        assert plain.stats()["draft_hits"] == 0
        # greedy self-speculation: the bonus token is the drafter's own next draft, so the block drafted
        # ahead while the host waited is exactly the next block
        greedy = generate(plain, verifier, prompt, 28, 3, 0.0, 0, 3, MAX_SEQ)
        before = ahead.stats()["draft_hits"]
        assert generate(ahead, verifier, prompt, 28, 3, 0.0, 0, 4, MAX_SEQ, pause=0.05) == greedy
        st = ahead.stats()
        assert st["ahead"] > 0 and st["draft_hits"] - before >= 3 * 5
    finally:
        plain.close()
        ahead.close()
