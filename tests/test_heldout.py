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


def test_run_as_a_command_it_prints_each_sets_prompts(tok):
    """`python -m specmesh.tools.heldout` printed nothing and exited 0 (it was only a module); it now prints each set's
    first prompts, one a line, under a line saying which set it is and what it is for."""
    import subprocess
    import sys

    from specmesh.host.layout import ROOT

    done = subprocess.run([sys.executable, "-m", "specmesh.tools.heldout", "--prompts", "2"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    want = {name: [tok.decode(p) for p in prompt_set(name, MODELS, tok, 2)] for name in PROMPT_SETS}
    assert lines[0].startswith("# tinystories, the tuning set") and lines[1:3] == want["tinystories"]
    assert lines[3].startswith("# handwritten, the report set") and lines[4:] == want["handwritten"]
    assert lines[3].endswith(": its first 2 prompts, one a line")
    one = subprocess.run([sys.executable, "-m", "specmesh.tools.heldout", "--set", "handwritten", "--prompts", "1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert one.stdout.splitlines()[0].endswith(": its first 1 prompt, one a line"), one.stdout


def test_a_prompt_file_that_is_not_utf8_is_one_line(tmp_path, monkeypatch, capsys):
    """The command's prompt files damaged (not UTF-8): one line naming the file and what to do, not a traceback."""
    import shutil

    from specmesh.tools import heldout

    shutil.copy(MODELS / "tokenizer.bin", tmp_path)
    (tmp_path / "heldout.txt").write_bytes(b"Once \xff upon a time")
    monkeypatch.setattr(heldout, "MODELS", tmp_path)
    with pytest.raises(SystemExit) as e:
        heldout.main(["--set", "tinystories"])
    assert e.value.code == 1 and capsys.readouterr() == ("", "heldout: %s is not UTF-8 text (byte 5): restore it (git "
                                                             "checkout models/heldout.txt)\n" % (tmp_path / "heldout.txt"))
