"""The shipped models, tokenizer and vocab table (models/): llama2.c's encoding, the golden stories260K
continuation, budgets, file checks, and the int8 engine against the float model's reference outputs
saved at export time (no PyTorch needed)."""

import struct
from pathlib import Path

import numpy as np
import pytest

from specmesh.host.backends.engine import Engine, to_float
from specmesh.host.backends.modelio import read_model, write_model
from specmesh.host.decode.tokenizer import (BOS, Tokenizer, TokenizerError, pack_vocab, read_llama2c_tokenizer, unpack_vocab,
                                   vocab_id)
from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.shared.modelfile import HEADER_SIZE, VERSION, ModelFileError, tensor_layout

MODELS = Path(__file__).resolve().parent.parent / "models"
NAMES = ("drafter", "target")
# llama2.c's published greedy continuation of "Once upon a time" by stories260K (40 tokens)
GOLDEN = ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball."
# the integer engine against the float model: every logit within LOGIT_TOL of the row's logit range, and
# the same argmax wherever the float model's top-2 margin exceeds NEAR_TIE logits. Measured on the
# shipped files against the float16 reference: at most 7.1% of the range for the target, 3.8% for the
# drafter (0.77 logits), argmax flips only below a 0.25 margin (target) and 0.17 (drafter)
LOGIT_TOL = {"drafter": 0.06, "target": 0.08}
NEAR_TIE = {"drafter": 0.3, "target": 0.3}


@pytest.fixture(scope="module")
def ref():
    return np.load(MODELS / "reference.npz")


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_llama2c(MODELS / "tokenizer.bin")


def run_c_encode(path: Path, text: str) -> list[int]:
    """llama2.c run.c's `encode`, literally (quadratic): the oracle for the tokenizer."""
    pieces, scores = read_llama2c_tokenizer(path)
    ids = {p: i for i, p in enumerate(pieces)}
    out = []
    for ch in " " + text:
        b = ch.encode("utf-8")
        out += [ids[b]] if b in ids else [c + 3 for c in b]
    while True:
        best, at = -1, -1
        for i in range(len(out) - 1):
            j = ids.get(pieces[out[i]] + pieces[out[i + 1]], -1)
            if j >= 0 and (best < 0 or scores[j] > scores[best]):
                best, at = j, i
        if best < 0:
            return [BOS] + out
        out[at:at + 2] = [best]


def test_tokenizer_encodes_as_llama2c(tok):
    assert tok.encode("Once upon a time") == [1, 403, 407, 261, 378]
    stories = (MODELS / "heldout.txt").read_text("utf-8").split("\n\n")[:40]
    for text in stories + ["naïve café — \u2603 \U0001F600\ttabs\r\n  spaces", "a", "aaaa aaaa"]:
        assert tok.encode(text) == run_c_encode(MODELS / "tokenizer.bin", text), text


def test_tokenizer_round_trips_any_text(tok):
    text = "Speculative decoding, 2026: naïve café — \u2603 \U0001F600\x00\x07\ttabs\r\n  spaces"
    ids = tok.encode(text)
    assert ids[0] == BOS and max(ids) < 512 and tok.vocab_size == 512
    assert tok.decode(ids) == text
    assert tok.decode(tok.encode(text, bos=False)) == " " + text  # the dummy prefix stays without BOS
    assert len(tok.encode("the the the the", bos=False)) < len("the the the the")  # merges exist


def test_least_tokens_bounds_the_encoding_from_below(tok):
    """Tokenizer.least_tokens: what a too-long prompt is refused by before it is encoded (`specmesh run`, serve)."""
    stories = (MODELS / "heldout.txt").read_text("utf-8").split("\n\n")[:100]
    longest = max(tok.pieces, key=len).decode("utf-8")
    for text in stories + ["", "a", " ", "\U0001F600" * 9, longest * 50, (" " + longest) * 50]:
        for bos in (True, False):
            assert tok.least_tokens(text, bos) <= len(tok.encode(text, bos=bos)), (text[:40], bos)
    assert tok.least_tokens("Once upon a time " * 1000) > 512  # enough to refuse a long prompt unencoded


def test_vocab_table_matches_tokenizer(tok):
    data = (MODELS / "vocab.bin").read_bytes()
    board = Tokenizer.from_vocab_bin(MODELS / "vocab.bin")
    assert board.pieces == tok.pieces and len(data) < 4096
    assert board.pieces[:3] == [b"", b"", b""] and board.pieces[3 + 0x0A] == b"\n"
    ids = tok.encode("The dog said: \"Hi!\"\n\nThe end.")
    assert board.decode(ids) == tok.decode(ids)
    with pytest.raises(TokenizerError, match="decode"):
        board.encode("x")


def test_tokenizer_files_are_checked(tmp_path):
    good = pack_vocab([b"", b"a", b"bc"])
    assert unpack_vocab(good) == [b"", b"a", b"bc"]
    for bad, msg in ((b"XXXX" + good[4:], "magic"), (good[:9], "truncated"), (good + b"z", "corrupt"),
                     (good[:4] + b"\x02" + good[5:], "version")):
        with pytest.raises(TokenizerError, match=msg):
            unpack_vocab(bad)
    data = (MODELS / "tokenizer.bin").read_bytes()
    (tmp_path / "cut.bin").write_bytes(data[:-3])
    with pytest.raises(TokenizerError, match="truncated or corrupt"):
        Tokenizer.from_llama2c(tmp_path / "cut.bin")
    (tmp_path / "few.bin").write_bytes(data[:200])
    with pytest.raises(TokenizerError):
        Tokenizer.from_llama2c(tmp_path / "few.bin")


def test_golden_continuation_through_the_numpy_engine(tok):
    eng = Engine(MODELS / TARGET_FILE)
    ids = tok.encode("Once upon a time")
    logits = eng.forward(ids, 0)
    out = []
    while len(out) < 40:
        out.append(int(logits[-1].argmax()))
        logits = eng.forward(out[-1:])
    assert tok.decode(out) == GOLDEN


@pytest.mark.parametrize("name", NAMES)
def test_shipped_model_header(name):
    h, t = read_model(MODELS / (name + ".spm"))
    assert h.tokenizer_id == vocab_id((MODELS / "vocab.bin").read_bytes())
    assert h.vocab == 512 and h.max_seq == {"drafter": 256, "target": 512}[name]  # the drafter's training windows
    params = sum(r * c for _n, _k, r, c in tensor_layout(h))
    if name == "drafter":  # a classic ESP32 reads it in place from its ROMFS partition (host/boardclasses.py)
        from specmesh.host.boardclasses import ESP32
        from specmesh.host.provision.romfs import image

        assert len(image(MODELS / DRAFTER_FILE)) <= ESP32.romfs_bytes
    else:  # stories260K
        assert (h.dim, h.n_layers, h.n_heads, h.n_kv_heads, h.hidden) == (64, 5, 8, 4, 172)
        assert params == 260_032


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_and_corruption(tmp_path, name):
    data = (MODELS / (name + ".spm")).read_bytes()
    h, t = read_model(MODELS / (name + ".spm"))
    write_model(tmp_path / "copy.spm", h, t)
    assert (tmp_path / "copy.spm").read_bytes() == data  # the export path writes them as shipped: version 2
    assert data[4:6] == struct.pack("<H", VERSION) == b"\x02\x00"
    for bad, msg in ((data[:len(data) // 2], "truncated"), (data[:HEADER_SIZE - 3], "truncated"),
                     (data[:HEADER_SIZE + 100] + bytes([data[HEADER_SIZE + 100] ^ 1]) + data[HEADER_SIZE + 101:],
                      "CRC"), (b"GGUF" + data[4:], "magic"),
                     (data[:32] + bytes([data[32] ^ 1]) + data[33:], "CRC")):  # rope_theta: it ran, and gave garbage
        (tmp_path / "bad.spm").write_bytes(bad)
        with pytest.raises(ModelFileError, match=msg):
            read_model(tmp_path / "bad.spm")


@pytest.mark.parametrize("name", NAMES)
def test_int8_logits_track_float_reference(ref, name):
    eng = Engine(MODELS / (name + ".spm"))
    for toks, flt in zip(ref[name + ".tokens"], ref[name + ".logits"].astype(np.float32)):
        eng.reset()
        got = to_float(eng.forward(toks, 0))
        span = flt.max(axis=1) - flt.min(axis=1)
        assert (np.abs(got - flt).max(axis=1) <= LOGIT_TOL[name] * span).all()
        top2 = np.sort(flt, axis=1)[:, -2:]
        clear = top2[:, 1] - top2[:, 0] > NEAR_TIE[name]
        assert clear.mean() > 0.5
        assert (got.argmax(axis=1) == flt.argmax(axis=1))[clear].all()


@pytest.mark.parametrize("name", NAMES)
def test_integer_engine_heldout_loss_within_one_percent_of_float(ref, tok, name):
    """The model card's held-out loss (tools/modelcard.py: the loss stories of models/heldout.txt) of the
    integer engine, against the float model's saved at export (measured: stories260K +0.42%, drafter
    +0.09%)."""
    from specmesh.tools.modelcard import LOSS_STORIES, heldout_stories, int8_loss

    stories = heldout_stories(MODELS / "heldout.txt")
    got = int8_loss(MODELS / (name + ".spm"), [tok.encode(stories[i])[:512] for i in LOSS_STORIES])
    want = float(ref[name + ".float_loss"])
    assert abs(got - want) <= 0.01 * want, (got, want)


@pytest.mark.parametrize("name", NAMES)
def test_int8_greedy_matches_float_greedy(ref, name):
    """Along the float model's greedy continuation, the int8 engine picks the same token at every step
    that is not a near-tie for the float model (the engine is fed the float path, so it cannot drift)."""
    eng = Engine(MODELS / (name + ".spm"))
    clear = 0
    for prompt, want, margin in zip(ref[name + ".prompt"], ref[name + ".greedy"], ref[name + ".margin"]):
        eng.reset()
        rows = eng.forward(np.concatenate([prompt, want[:-1]]), 0)[len(prompt) - 1:]
        got = rows.argmax(axis=1)
        assert (got == want)[margin > NEAR_TIE[name]].all()
        clear += int((margin > NEAR_TIE[name]).sum())
    assert clear >= ref[name + ".greedy"].size // 3  # the check is not vacuous: a third of the steps at least


@pytest.mark.parametrize("name, cut, says", [("tokenizer.bin", 0, "not a llama2.c tokenizer.bin"),
                                             (TARGET_FILE, 1000, "is truncated"),
                                             ("heldout.txt", 0, "holds 0 stories, the loss figures need 128"),
                                             ("reference.npz", 100, "reference.npz is not a whole .npz archive")])
def test_modelcard_on_a_corrupt_model_folder_is_one_line(tmp_path, capsys, name, cut, says):
    """tools/modelcard.py on a truncated tokenizer or model file: one line naming the file, status 1, no
    traceback and no figures file."""
    from specmesh.tools import modelcard

    for f in MODELS.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes()[:cut] if f.name == name else f.read_bytes())
    assert modelcard.main(["--models", str(tmp_path), "--json", str(tmp_path / "figures.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("modelcard: ") and says in err and err.count("\n") == 1
    assert not (tmp_path / "figures.json").exists()


@pytest.mark.parametrize("tool", ["modelcard", "export"])
def test_a_corrupt_tokenizer_in_a_tools_models_folder_says_what_to_do(tmp_path, capsys, tool):
    """A tokenizer.bin cut short in the folder modelcard --models or export --out reads said "F holds 7 tokens: a
    llama2.c tokenizer has 3 specials and 256 byte tokens", and no way on; it says what a run says of it."""
    if tool == "export":
        pytest.importorskip("torch", reason="export needs PyTorch: without it, it says how to install it")
    import importlib

    for f in MODELS.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes()[:100] if f.name == "tokenizer.bin" else f.read_bytes())
    argv = (["--models", str(tmp_path), "--json", str(tmp_path / "figures.json")] if tool == "modelcard" else
            ["--model", "x=%s" % (tmp_path / "x.pt"), "--out", str(tmp_path)])
    assert importlib.import_module("specmesh.tools." + tool).main(argv) == 1  # (export's import needs torch)
    err = capsys.readouterr().err
    assert err.startswith("%s: %s holds 7 tokens" % (tool, tmp_path / "tokenizer.bin")) and err.endswith(
        ": copy the models' own tokenizer.bin there again (the shipped one is in %s)\n" % MODELS)


@pytest.mark.parametrize("flag", ["--prompts", "--new"])
@pytest.mark.parametrize("value", ["0", "-5"])
def test_modelcard_refuses_no_prompts_or_no_new_tokens_in_one_line(tmp_path, capsys, flag, value):
    from specmesh.tools import modelcard

    assert modelcard.main([flag, value, "--json", str(tmp_path / "figures.json")]) == 2
    err = capsys.readouterr().err
    assert err == "modelcard: %s must be at least 1, not %s\n" % (flag, value)
    assert not (tmp_path / "figures.json").exists()


def test_modelcard_json_that_cannot_be_written_is_one_line_before_measuring(tmp_path, capsys):
    from specmesh.tools import modelcard

    (tmp_path / "file").write_text("")
    assert modelcard.main(["--models", str(tmp_path), "--json", str(tmp_path / "file" / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("modelcard: --json") and "is a file, not a folder" in err and err.count("\n") == 1


@pytest.mark.parametrize("name", [TARGET_FILE, "MODEL_CARD.md"])
def test_modelcard_json_naming_a_file_of_its_models_folder_is_refused_before_measuring(tmp_path, capsys, name):
    """`--json models/target.spm` (a slip of tab completion) replaced the model with the figures after the minutes of
    measuring, status 0: refused before any work, the file untouched, as run's --stats-json is."""
    from specmesh.tools import modelcard

    (tmp_path / name).write_bytes((MODELS / name).read_bytes())
    assert modelcard.main(["--models", str(tmp_path), "--json", str(tmp_path / name)]) == 2
    assert capsys.readouterr().err == ("modelcard: --json %s cannot be written: it would overwrite %s, which this tool "
                                       "reads: give another file\n" % (tmp_path / name, name))
    assert (tmp_path / name).read_bytes() == (MODELS / name).read_bytes()


@pytest.mark.parametrize("summary, best, says", [
    ("{bad", None, "summary.json is not tools/train.py's summary (no steps and train_s in a JSON object)"),
    ("[1]", None, "summary.json is not tools/train.py's summary (no steps and train_s in a JSON object)"),
    ('{"steps": 1, "train_s": 2}', b"", "best.pt is not a checkpoint of tools/train.py (EOFError)")])
def test_modelcard_variants_damaged_are_one_line_before_measuring(tmp_path, capsys, monkeypatch, summary, best, says):
    """A --variants folder whose summary.json or best.pt is damaged was found only once the shipped models had been
    measured (minutes), the summary's line naming no file ("modelcard: Expecting value: line 1 column 1")."""
    pytest.importorskip("torch", reason="--variants exports with PyTorch: without it, they are refused for that")
    from specmesh.tools import modelcard

    monkeypatch.setattr(modelcard, "measure", lambda a: pytest.fail("measured before the variants were read"))
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "summary.json").write_text(summary)
    (tmp_path / "ck" / "best.pt").write_bytes(best if best is not None else b"")
    if best is None:  # a best.pt that is one: the summary's line is the one looked at
        monkeypatch.setattr("specmesh.tools.export.load_float", lambda path: None)
    assert modelcard.main(["--variants", str(tmp_path / "ck"), "--json", str(tmp_path / "figures.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("modelcard: --variants: %s" % (tmp_path / "ck" / says.split()[0])) and says in err and \
        err.endswith(": give checkpoint folders of tools/train.py\n" if best is None else "\n") and err.count("\n") == 1


def test_modelcard_variants_that_are_no_checkpoint_folders_are_one_line_before_measuring(tmp_path, capsys):
    """A --variants folder without its summary.json or best.pt was an errno line once the shipped models were measured."""
    pytest.importorskip("torch", reason="--variants exports with PyTorch: without it, they are refused for that")
    from specmesh.tools import modelcard

    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "summary.json").write_text("{}")
    assert modelcard.main(["--variants", str(tmp_path / "ck"), "--json", str(tmp_path / "figures.json")]) == 1
    assert capsys.readouterr().err == "modelcard: --variants: no %s: give checkpoint folders of tools/train.py\n" % (
        tmp_path / "ck" / "best.pt")


def test_modelcard_with_no_draft_tested_is_one_line(tmp_path, capsys):
    """--new 1 (the first token is the prefill's: no round) or a held-out file with no acceptance story."""
    from specmesh.tools import modelcard

    assert modelcard.main(["--prompts", "1", "--new", "1", "--json", str(tmp_path / "figures.json")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("modelcard: no draft was tested") and err.count("\n") == 1
