"""A host drafter's unsure drafts (host/backends LocalDrafter `stop_margin`): a greedy block ends at its first
draft whose logit leads the runner-up by less than the margin, that draft sent last; the drafts before it are
the ones a full block has; greedy text stays plain decoding's; sampled sessions and fixed gamma draft every
draft asked for; the CLI turns it on for the host drafter of one verifier under gamma auto only."""

from pathlib import Path

import numpy as np

from specmesh.host.backends import UNSURE_MARGIN, LocalDrafter, LocalVerifier, SessionParams
from specmesh.host.backends.engine import Engine, unsure
from specmesh.host.cli.session import Setup, config_from
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import generate
from specmesh.host.decode.tokenizer import Tokenizer
from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE

MODELS = Path(__file__).resolve().parent.parent / "models"


def prompt() -> list[int]:
    return Tokenizer.from_llama2c(MODELS / "tokenizer.bin").encode("The little dog ran to the park")


def test_unsure_is_a_lead_below_the_margin_and_a_tie_is_unsure():
    row = np.array([5, 100, 40, 100 - 7], np.int64)
    assert unsure(row, 8) and not unsure(row, 7)
    assert unsure(np.array([3, 9, 9], np.int64), 1)  # two equal largest logits: no lead at all


def test_a_greedy_block_ends_at_its_first_unsure_draft_and_keeps_the_full_blocks_drafts():
    committed = prompt()
    params = SessionParams()
    full, cut = LocalDrafter(MODELS / DRAFTER_FILE), LocalDrafter(MODELS / DRAFTER_FILE, stop_margin=UNSURE_MARGIN)
    oracle = Engine(MODELS / DRAFTER_FILE)
    short = 0
    for d in (full, cut):
        d.begin(params, committed)
    for n in range(len(committed) - 6, len(committed) + 1):
        want, got = full.draft(committed[:n], 8), cut.draft(committed[:n], 8)
        assert 1 <= len(got) <= 8 and got.tokens == want.tokens[:len(got)]
        rows = oracle.forward(committed[:n] + want.tokens[:len(got) - 1], 0)[n - 1:]
        margins = [unsure(row, UNSURE_MARGIN) for row in rows]
        assert not any(margins[:-1]) and (margins[-1] or len(got) == 8)  # it stops at the first unsure one
        short += len(got) < 8
    assert short  # the prompt has unsure drafts, so the test walks the stop


def test_the_text_is_plain_decodings_and_sampled_sessions_draft_every_draft():
    committed = prompt()
    verifier = LocalVerifier(MODELS / TARGET_FILE)
    cut = LocalDrafter(MODELS / DRAFTER_FILE, stop_margin=UNSURE_MARGIN)
    plain = generate(committed, verifier, None, SessionParams(), 48)
    res = generate(committed, verifier, cut, SessionParams(), 48, GammaController(fixed=6))
    assert res.tokens == plain.tokens
    assert any(0 < r.gamma < 6 for r in res.rounds[:-1])  # blocks cut short, not only the stream's last one
    sampled = SessionParams(seed=5, temperature=0.8)
    cut.begin(sampled, committed)
    assert len(cut.draft(committed, 8)) == 8


def test_the_cli_gives_the_host_drafter_the_margin_under_gamma_auto_and_one_verifier_only():
    auto, fixed = config_from(drafter="cpu", verifier="cpu"), config_from(drafter="cpu", verifier="cpu", gamma="4")
    with Setup(auto) as s:
        assert s.make("drafter", "cpu").stop_margin == UNSURE_MARGIN
        assert s.make("drafter", "cpu", batched=True).stop_margin == UNSURE_MARGIN
        assert not hasattr(s.make("verifier", "cpu"), "stop_margin")
    with Setup(fixed) as s:
        assert s.make("drafter", "cpu").stop_margin == 0
    with Setup(config_from(drafter="cpu", stages=2)) as s:
        assert s.make("drafter", "cpu").stop_margin == 0
