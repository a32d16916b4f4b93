"""The held-out protocol (tools/heldout.py): two disjoint prompt sets of different sources, the report set
never seen by training data or by the tuning set."""

import pytest

from specmesh.host.decode.tokenizer import BOS, Tokenizer
from specmesh.host.layout import MODELS
from specmesh.tools.heldout import HANDWRITTEN, PROMPT_SETS, PROMPT_TOKENS, heldout_stories, prompt_set


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_llama2c(MODELS / "tokenizer.bin")


def test_the_report_set_is_whole_hand_written_lines_from_bos(tok):
    lines = [s for s in (MODELS / HANDWRITTEN).read_text("utf-8").splitlines() if s.strip()]
    prompts = prompt_set("handwritten", MODELS, tok, len(lines))
    assert len(prompts) == len(lines) >= 16
    assert all(p[0] == BOS and tok.decode(p[1:]).strip() == s.strip() for p, s in zip(prompts, lines))


def test_the_two_sets_share_no_text_and_the_report_set_is_in_no_training_data(tok):
    lines = [s.strip() for s in (MODELS / HANDWRITTEN).read_text("utf-8").splitlines() if s.strip()]
    seen = "\n".join([*heldout_stories(MODELS / "heldout.txt"),
                      (MODELS / "tinystories_train_head.txt").read_text("utf-8")])
    assert not [s for s in lines if s in seen]
    tuning = {tuple(p) for p in prompt_set("tinystories", MODELS, tok, 16)}
    assert all(len(p) == PROMPT_TOKENS for p in tuning)
    assert not tuning & {tuple(p) for p in prompt_set("handwritten", MODELS, tok, 16)}


def test_an_unknown_set_names_the_known_ones(tok):
    with pytest.raises(ValueError, match=", ".join(PROMPT_SETS)):
        prompt_set("wikipedia", MODELS, tok, 4)
