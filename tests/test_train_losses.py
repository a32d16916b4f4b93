"""The distillation losses and data of tools/train.py (needs torch): the acceptance-shaped terms measure what
the acceptance rule does, greedy pools are the model's own argmax text, and a model file starts a phase."""

import argparse

import pytest

torch = pytest.importorskip("torch", reason="no PyTorch (the gpu extra): `make test-torch` runs these")

from specmesh.host.layout import MODELS
from specmesh.tools.export import export_model
from specmesh.tools.modeldefs import ModelArgs, Transformer
from specmesh.tools.train import distil_loss, initial_weights, loss_terms, qhat, text_windows

pytestmark = [pytest.mark.torch]
HELDOUT = MODELS / "heldout.txt"


def test_loss_terms_parse_weights_and_refuse_unknown_terms():
    assert loss_terms("kl") == {"kl": 1.0}
    assert loss_terms("kl:0.5,tv:1,greedy:2") == {"kl": 0.5, "tv": 1.0, "greedy": 2.0}
    for bad in ("ce", "kl:x", "kl:-1", "tv:nan", "greedy:inf"):  # a negative weight trained away from the target
        with pytest.raises(argparse.ArgumentTypeError):
            loss_terms(bad)


def test_the_tv_term_is_one_minus_the_acceptance_at_t1_and_greedy_follows_the_argmax():
    g = torch.Generator().manual_seed(0)
    tl = torch.log_softmax(torch.randn(6, 20, generator=g), -1)
    lq = torch.log_softmax(torch.randn(6, 20, generator=g), -1)
    accept = torch.minimum(tl.exp(), qhat(lq, 8)).sum(-1).mean()  # the rule's i.i.d. acceptance at T = 1
    assert float(distil_loss(lq, tl, {"tv": 1.0}, 8)) == pytest.approx(1 - float(accept), abs=1e-5)
    assert float(distil_loss(tl, tl, {"kl": 1.0}, 8)) == pytest.approx(0.0, abs=1e-6)
    want = -lq[torch.arange(6), tl.argmax(-1)].mean()
    assert float(distil_loss(lq, tl, {"greedy": 1.0}, 8)) == pytest.approx(float(want), abs=1e-5)


def tiny() -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelArgs(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, vocab=40, max_seq=32)).eval()


def test_a_greedy_pool_row_is_the_models_own_argmax_continuation():
    # after its opening a row draws one token at T = 1 (as every row cooler than 1 does), then its argmax
    m = tiny()
    rows = m.sample(2, 12, torch.Generator().manual_seed(1), (0.0,), [[1, 5, 7], [1, 9]])
    for row, given in zip(rows, (3, 2)):
        with torch.no_grad():
            logits = m(row[None, :-1])[0]
        assert torch.equal(row[given + 1:], logits[given:].argmax(-1))


def test_text_windows_are_slices_of_the_paragraphs_laid_end_to_end():
    paras = [[1, 4, 5, 6], [1, 7, 8], [1, 9, 10, 11, 12]]
    stream = [t for p in paras for t in p]
    for w in text_windows(paras, 5, 4, torch.Generator().manual_seed(0)).tolist():
        assert any(stream[i:i + 5] == w for i in range(len(stream) - 4))


def test_a_pool_of_text_share_1_is_all_windows_of_the_paragraphs():
    """--text-share 1 left the target no row to sample: torch's reshape error at the first step."""
    from specmesh.tools.train import target_pool

    paras = [[1] + list(range(4, 30)), [1] + list(range(5, 25))]
    a = argparse.Namespace(seed=0, pool=3, text_share=1.0, seq=8, temps=(1.0,))
    pool, lp = target_pool(tiny(), a, 0, paras)
    stream = [t for p in paras for t in p]
    assert pool.shape == (3, 9) and lp.shape == (3, 8, 40)
    assert all(any(stream[i:i + 9] == w for i in range(len(stream) - 8)) for w in pool.tolist())


def test_a_model_file_starts_a_phase_with_its_dequantized_weights(tmp_path):
    m = tiny()
    export_model(m, tmp_path / "m.spm", tokenizer_id=1)
    state = initial_weights(tmp_path / "m.spm")
    for name, w in m.state_dict().items():
        assert (state[name] - w).abs().max() <= w.abs().max() / 100  # int8 per row


def test_a_layer_subset_is_the_deeper_models_layers_in_order_and_the_trainer_refuses_a_wrong_count(capsys):
    from specmesh.tools.modeldefs import layer_subset
    from specmesh.tools.train import main

    torch.manual_seed(0)
    deep = Transformer(ModelArgs(dim=16, n_layers=3, n_heads=2, n_kv_heads=1, hidden=32, vocab=40, max_seq=32)).eval()
    shallow = Transformer(ModelArgs(dim=16, n_layers=2, n_heads=2, n_kv_heads=1, hidden=32, vocab=40, max_seq=32)).eval()
    shallow.load_state_dict(layer_subset(deep.state_dict(), [0, 2]))
    x = torch.randint(0, 40, (2, 12))
    with torch.no_grad():  # the same as the deep model with its middle layer skipped
        h = deep.tok_emb(x)
        for i in (0, 2):
            h = deep.layers[i](h, deep.cos[:12], deep.sin[:12])
        want = deep.final_norm(h) @ deep.tok_emb.weight.t()
        assert torch.allclose(shallow(x), want, atol=1e-6)
    assert main(["--shape", "t64l4", "--out", "unused", "--init-layers", "0,1,2"]) == 2
    assert "names 3 distinct layers of the target, --shape t64l4 has 4" in capsys.readouterr().err


@pytest.mark.parametrize("flags, says", [
    (["--batch", "0"], "--batch must be at least 1, not 0"),  # was torch's reshape error, the target loaded
    (["--refresh", "0"], "--refresh must be at least 1, not 0"),  # a division by zero at the first step
    (["--eval-every", "0"], "--eval-every must be at least 1, not 0"),
    (["--seq", "300"], "--seq must be in 1..256, not 300"),  # past the shape's RoPE table
    (["--text-share", "2"], "--text-share must be in 0..1, not 2"),  # a tensor of negative size
    (["--temps", "1,-1"], "--temps must be at least 0, not -1"),
    (["--lr", "-1"], "--lr must be a number above 0, not -1"),  # the optimizer's traceback
    (["--steps", "5", "--stop-at", "10"], "--stop-at must be in 0..5, not 10"),  # stopped at 5, unsaid
    (["--steps", "0"], "--steps must be at least 1, not 0"),  # no step: a summary of best alpha -1 and no best.pt
    (["--lr", "nan"], "--lr must be a number above 0, not nan"),
    (["--seed", str(2 ** 64)], "--seed must be in 0..4294967295, not %d" % 2 ** 64),  # torch's overflow, a traceback
    (["--openings", str(HELDOUT), "--seq", "40"],  # a row's opening longer than the row: torch's size error
     "--seq must be in 48..256 (with --openings: a row opens with up to 48 tokens), not 40"),
    (["--text-share", "0.5"], "--text-share needs --openings: the paragraphs its windows are cut from"),  # ignored
    (["--shape", "t64l4", "--init-layers", "0,1,2,9"], "--init-layers must be in 0..4 (the target's layers), not 9"),
    (["--init-layers", "0,1"], "--init-layers needs a --shape of the target's layer shape (dim 64, 8 heads, 4 kv heads, "
                               "hidden 172), not d40l2kv1"),
])
def test_the_trainer_refuses_a_flag_no_run_can_use_in_one_line_before_the_target_loads(tmp_path, capsys, monkeypatch,
                                                                                       flags, says):
    from specmesh.tools import train

    monkeypatch.setattr(train, "train", lambda a: pytest.fail("trained"))
    shape = [] if "--shape" in flags else ["--shape", "d40l2kv1"]
    assert train.main(shape + ["--out", str(tmp_path / "ck")] + flags) == 2
    assert capsys.readouterr().err == "train: %s\n" % says
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("out, says", [
    ("", "--out is empty: give the folder for the checkpoints (an unset shell variable?)"),  # trained into the cwd
    ("{file}", "--out {file} is a file, not a folder: give the folder for the checkpoints"),  # "{file}: File exists"
    ("{file}/ck", "--out {file}/ck: {file} is a file, not a folder: give the folder for the checkpoints"),
])
def test_an_out_that_cannot_be_the_checkpoint_folder_is_one_line_before_the_target_loads(tmp_path, capsys,
                                                                                         monkeypatch, out, says):
    """--out '' (an unset shell variable's) trained into the folder it was run in, its last.pt and best.pt among the
    user's files; a file on its way was "train: FILE: File exists" once the target had loaded."""
    from specmesh.tools import train

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(train, "train", lambda a: pytest.fail("trained"))
    (tmp_path / "file").write_text("")
    out = out.format(file=tmp_path / "file")
    assert train.main(["--shape", "d40l2kv1", "--out", out, "--steps", "1"]) == 2
    assert capsys.readouterr().err == "train: %s\n" % says.format(file=tmp_path / "file")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


@pytest.mark.parametrize("flag, value, says", [
    ("--temps", "1,x", "'1,x' is not numbers separated by commas (e.g. 1,0.5)"),
    ("--init-layers", "a", "'a' is not layer numbers separated by commas (e.g. 0,1,2,4)"),
])
def test_a_list_flag_that_is_no_list_names_what_it_takes(tmp_path, capsys, flag, value, says):
    """argparse named the parser of --temps and --init-layers: "invalid <lambda> value: '1,x'"."""
    from specmesh.tools.train import main

    with pytest.raises(SystemExit) as stop:
        main(["--shape", "d40l2kv1", "--out", str(tmp_path / "ck"), flag, value])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == "python -m specmesh.tools.train: error: argument %s: %s" % (
        flag, says)


@pytest.mark.parametrize("flag", ["--heldout", "--openings"])
def test_a_text_with_no_story_or_not_utf8_is_one_line_before_the_target_loads(tmp_path, capsys, flag):
    """An empty --heldout was torch's reshape error once the target had continued no prompt; a text that is not UTF-8
    was heldout.py's ValueError as a traceback; an empty --openings trained without openings, unsaid."""
    from specmesh.tools.train import main

    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9\n")
    assert main(["--shape", "d40l2kv1", "--out", str(tmp_path / "ck"), flag, str(tmp_path / "empty.txt")]) == 1
    assert capsys.readouterr().err == "train: %s %s holds no story (paragraphs separated by blank lines)\n" % (
        flag, tmp_path / "empty.txt")
    assert main(["--shape", "d40l2kv1", "--out", str(tmp_path / "ck"), flag, str(tmp_path / "latin1.txt")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("train: %s is not UTF-8 text (byte 3)" % (tmp_path / "latin1.txt")) and err.count("\n") == 1
    assert not (tmp_path / "ck").exists()


@pytest.mark.parametrize("text, flags, says", [
    ("Hi.\n\nHi.\n", [], "holds no paragraph of more than 4 tokens: give longer paragraphs"),  # ignored, unsaid
    ("Once upon a time there was a cat. It liked to nap in the sun.\n", ["--text-share", "0.5", "--seq", "64"],
     "holds 24 tokens in its paragraphs, --text-share's windows of --seq 64 take at least 66: give more text"),
])
def test_openings_too_short_to_use_are_one_line_before_the_target_loads(tmp_path, capsys, monkeypatch, text, flags,
                                                                        says):
    """Paragraphs of 4 tokens or fewer trained without openings, unsaid; too few tokens for --text-share's windows was
    torch's error in the first pool, once the target had loaded."""
    from specmesh.tools import train

    monkeypatch.setattr(train, "train", lambda a: pytest.fail("trained"))
    (tmp_path / "o.txt").write_text(text)
    assert train.main(["--shape", "d40l2kv1", "--out", str(tmp_path / "ck"), "--openings", str(tmp_path / "o.txt")]
                      + flags) == 1
    assert capsys.readouterr().err == "train: --openings %s %s\n" % (tmp_path / "o.txt", says)


SMALL_RUN = ["--steps", "1", "--val-stories", "1", "--val-new", "2", "--pool", "2", "--batch", "1", "--seq", "8"]


def test_weights_to_start_or_resume_from_that_are_unusable_are_one_line(tmp_path, capsys):
    """An empty or cut-short .pt, or a last.pt of another --shape in --out, was torch's traceback (an EOFError, a zip
    reader's error, or a list of every mismatched key and size)."""
    from specmesh.tools.modeldefs import DRAFTERS
    from specmesh.tools.train import main

    (tmp_path / "empty.pt").write_bytes(b"")
    assert main(["--shape", "d40l2kv1", "--out", str(tmp_path / "a"), "--init", str(tmp_path / "empty.pt")] + SMALL_RUN) == 1
    assert capsys.readouterr().err == "train: %s is not a checkpoint of tools/train.py (EOFError): give a .pt that it " \
        "wrote\n" % (tmp_path / "empty.pt")
    (tmp_path / "b").mkdir()
    other = Transformer(DRAFTERS["d48l2kv1"])
    torch.save({"model": other.state_dict(), "config": other.a.to_dict()}, tmp_path / "b" / "last.pt")
    assert main(["--shape", "d40l2kv1", "--out", str(tmp_path / "b")] + SMALL_RUN) == 1
    assert capsys.readouterr().err == "train: %s holds weights of another shape than --shape d40l2kv1: give its own " \
        "--shape to resume it, or another --out\n" % (tmp_path / "b" / "last.pt")


def test_train_all_takes_no_argument_and_starts_nothing_on_one(capsys):
    """train_all looked at no argument: `--help` started its hours of training."""
    from specmesh.tools.train_all import main

    for argv, status in ((["--help"], 0), (["--steps", "3"], 2)):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == status
    assert "unrecognized arguments: --steps 3" in capsys.readouterr().err
