"""The PyTorch model definition and the exporter agree with the numpy int8 engine (needs torch: slow)."""

import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="no PyTorch (the gpu extra): `make test-torch` runs these")

from specmesh.host.backends.engine import Engine, to_float
from specmesh.tools.export import export_model
from specmesh.tools.modeldefs import ModelArgs, Transformer

pytestmark = [pytest.mark.torch, pytest.mark.slow]


@pytest.mark.parametrize("shared", [True, False])
def test_exported_model_tracks_torch(tmp_path, shared):
    torch.manual_seed(0)
    a = ModelArgs(dim=48, n_layers=2, n_heads=6, n_kv_heads=2, hidden=96, vocab=80, max_seq=40, shared_cls=shared)
    m = Transformer(a).eval()
    with torch.no_grad():  # larger weights than the init so logits spread and a wrong RoPE/GQA shows
        for p in m.parameters():
            if p.dim() == 2:
                p.normal_(0, p.shape[1] ** -0.5)
    h = export_model(m, tmp_path / "m.spm", tokenizer_id=7)
    assert h.tokenizer_id == 7
    toks = torch.randint(0, a.vocab, (1, 30), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = m(toks)[0].numpy()
    eng = Engine(tmp_path / "m.spm")
    got = to_float(eng.forward(toks[0].tolist(), 0))
    span = want.max(axis=1) - want.min(axis=1)
    assert (np.abs(got - want).max(axis=1) < 0.04 * span).all()
    assert (got.argmax(axis=1) == want.argmax(axis=1)).mean() > 0.9
    # the same tokens one at a time through the KV cache give the batched logits
    eng.reset()
    steps = np.stack([eng.forward([t], i)[0] for i, t in enumerate(toks[0].tolist())])
    np.testing.assert_array_equal(to_float(steps), got)


def _export_folder(tmp_path):
    """A folder holding what `export --out` reads beside the models (the shipped vocab, tokenizer and stories) and a
    tiny checkpoint of tools/train.py's layout."""
    from tests.conftest import ROOT

    for name in ("vocab.bin", "tokenizer.bin", "heldout.txt"):
        (tmp_path / name).write_bytes((ROOT / "models" / name).read_bytes())
    torch.manual_seed(0)
    m = Transformer(ModelArgs(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, max_seq=80))
    torch.save({"model": m.state_dict(), "config": m.a.to_dict()}, tmp_path / "tiny.pt")


def test_export_refuses_a_file_that_is_no_checkpoint_and_a_broken_archive_in_one_line(tmp_path, capsys):
    """An empty .pt was torch's EOFError traceback; a reference.npz cut short, np.load's after the checkpoints loaded."""
    from specmesh.tools.export import main

    _export_folder(tmp_path)
    (tmp_path / "empty.pt").write_bytes(b"")
    assert main(["--out", str(tmp_path), "--model", "x=%s" % (tmp_path / "empty.pt")]) == 1
    assert capsys.readouterr().err == "export: %s is not a checkpoint of tools/train.py (EOFError): give a .pt that " \
        "it wrote\n" % (tmp_path / "empty.pt")
    (tmp_path / "reference.npz").write_bytes(b"PK\x03\x04 cut short")
    assert main(["--out", str(tmp_path), "--model", "x=%s" % (tmp_path / "tiny.pt")]) == 1
    assert capsys.readouterr().err == "export: %s is not a whole .npz archive (BadZipFile): restore it (git checkout " \
        "models/reference.npz), or remove it and export the models again\n" % (tmp_path / "reference.npz")
    assert not (tmp_path / "x.spm").exists()


def test_export_of_a_configuration_a_model_file_cannot_hold_names_the_field_before_any_work(tmp_path, monkeypatch,
                                                                                           capsys):
    """A checkpoint whose configuration a model file cannot hold (here a norm_eps past the integer arithmetic's 0.5)
    was exported after its reference outputs had been computed, and refused as "model header has norm_eps 0.6, outside
    0..0.5: the file is corrupt", though no file was: now it is the field and what to choose, before that work."""
    from specmesh.tools import export

    _export_folder(tmp_path)
    torch.manual_seed(0)
    m = Transformer(ModelArgs(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, max_seq=80, norm_eps=0.6))
    torch.save({"model": m.state_dict(), "config": m.a.to_dict()}, tmp_path / "eps.pt")
    monkeypatch.setattr(export, "reference", lambda *a: pytest.fail("its reference outputs were computed"))
    assert export.main(["--out", str(tmp_path), "--model", "x=%s" % (tmp_path / "eps.pt")]) == 1
    assert capsys.readouterr().err == ("export: model %s cannot be written: its norm_eps 0.6 is outside 0..0.5: choose "
                                       "norm_eps below 0.5 (1e-5 is usual)\n" % (tmp_path / "x.spm"))
    assert not (tmp_path / "x.spm").exists() and not (tmp_path / "reference.npz").exists()


def test_export_of_a_context_shorter_than_its_reference_outputs_is_one_line_before_any_work(tmp_path, monkeypatch,
                                                                                           capsys):
    """A checkpoint whose context (max_seq 24, a llama2.c test model's) is shorter than the 64 positions of export's
    reference outputs was torch's "size of tensor a (25) must match" traceback once they were being computed."""
    from specmesh.tools import export

    _export_folder(tmp_path)
    torch.manual_seed(0)
    m = Transformer(ModelArgs(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, max_seq=24))
    torch.save({"model": m.state_dict(), "config": m.a.to_dict()}, tmp_path / "short.pt")
    monkeypatch.setattr(export, "reference", lambda *a: pytest.fail("its reference outputs were computed"))
    assert export.main(["--out", str(tmp_path), "--model", "x=%s" % (tmp_path / "short.pt")]) == 1
    assert capsys.readouterr().err == (
        "export: --model x=%s: its context holds 24 positions, export's reference outputs need %d: give a checkpoint "
        "of max_seq %d or more\n" % (tmp_path / "short.pt", export.REF_LEN, export.REF_LEN))
    assert not (tmp_path / "x.spm").exists() and not (tmp_path / "reference.npz").exists()


def test_export_to_a_model_file_that_is_a_folder_is_one_line_before_any_work(tmp_path, monkeypatch, capsys):
    """`--model x=A --model y=B` where --out holds a folder y.spm wrote x.spm, then failed on y.spm once the reference
    outputs were computed: x.spm new beside reference outputs old, what export's order of writes is there to avoid."""
    from specmesh.tools import export

    _export_folder(tmp_path)
    (tmp_path / "y.spm").mkdir()
    monkeypatch.setattr(export, "reference", lambda *a: pytest.fail("its reference outputs were computed"))
    tiny = tmp_path / "tiny.pt"
    argv = ["--out", str(tmp_path), "--model", "x=%s" % tiny, "--model", "y=%s" % tiny]
    assert export.main(argv) == 1
    assert capsys.readouterr().err == "export: model %s cannot be written: it is a folder\n" % (tmp_path / "y.spm")
    assert not (tmp_path / "x.spm").exists() and not (tmp_path / "reference.npz").exists()


def _other_vocab(folder):
    """folder/vocab.bin replaced by the table of another tokenizer of the same size (two pieces swapped)."""
    from specmesh.host.decode.tokenizer import pack_vocab, unpack_vocab

    pieces = unpack_vocab((folder / "vocab.bin").read_bytes())
    pieces[300], pieces[301] = pieces[301], pieces[300]
    (folder / "vocab.bin").write_bytes(pack_vocab(pieces))


def test_export_and_training_refuse_a_vocab_table_of_another_tokenizer_in_one_line(tmp_path, monkeypatch, capsys):
    """export and train_all took vocab.bin's CRC as the models' tokenizer id without checking it against tokenizer.bin:
    a vocab.bin of another tokenizer gave models whose headers named that one (a run then refused them with the
    tokenizer.bin they were trained with). Both refuse it in one line, before anything is written or trained."""
    from specmesh.tools import export, run_tool, train_all

    _export_folder(tmp_path)
    _other_vocab(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    said = ("%s is not the vocab table of %s (it is another tokenizer's): the models' headers would name the wrong "
            "tokenizer; put the vocab.bin of this tokenizer beside it (llama2c_import --tokenizer writes it; git "
            "checkout models/vocab.bin models/tokenizer.bin restores the shipped pair)\n"
            % (tmp_path / "vocab.bin", tmp_path / "tokenizer.bin"))
    assert export.main(["--out", str(tmp_path), "--model", "x=%s" % (tmp_path / "tiny.pt")]) == 1
    assert capsys.readouterr().err == "export: " + said
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before

    def trained(argv):
        raise AssertionError("train_all trained with a vocab.bin of another tokenizer")

    monkeypatch.setattr(train_all, "MODELS", tmp_path)
    monkeypatch.setattr(train_all.train, "main", trained)
    with pytest.raises(SystemExit) as e:
        run_tool("train_all", lambda: train_all.main([]))
    assert e.value.code == 1
    assert capsys.readouterr().err == "train_all: " + said
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_export_of_a_model_file_says_it_is_exported_already(tmp_path, capsys):
    """A .spm given as the checkpoint was read as a llama2.c one: "implausible llama2.c header {'dim': 1296912467,
    ...}: not a llama2.c checkpoint?", which did not say what the file is or what to give."""
    from specmesh.tools.export import main
    from tests.conftest import ROOT

    _export_folder(tmp_path)
    model = ROOT / "models" / "target.spm"
    assert main(["--out", str(tmp_path), "--model", "x=%s" % model]) == 1
    assert capsys.readouterr().err == ("export: %s is a specmesh model file, exported already: give the checkpoint to "
                                       "export, a .pt that tools/train.py wrote or a llama2.c .bin\n" % model)
    assert not (tmp_path / "x.spm").exists()


@pytest.mark.parametrize("name", ["../escaped", "sub/x", "", "x.v2"])
def test_export_refuses_a_model_name_that_is_no_plain_file_name(tmp_path, capsys, name):
    """`--model ../escaped=CK` wrote escaped.spm beside --out, not in it; an empty name wrote ".spm"; the entries of
    "x.v2" in reference.npz went with the next export of x (it replaces every key starting "x."). Refused in one line,
    nothing written."""
    from specmesh.tools.export import main

    out = tmp_path / "out"
    out.mkdir()
    _export_folder(out)
    before = sorted(tmp_path.rglob("*"))
    spec = "%s=%s" % (name, out / "tiny.pt")
    assert main(["--out", str(out), "--model", spec]) == 1
    assert capsys.readouterr().err == "export: --model %s: NAME must be letters, digits, - and _ only (as " \
        "drafter-esp32): it becomes the file NAME.spm in --out\n" % spec
    assert sorted(tmp_path.rglob("*")) == before


def test_export_refuses_a_name_given_twice(tmp_path, capsys):
    """`--model a=x.pt --model a=y.pt` exported y alone as a.spm, x dropped unsaid: refused in one line, nothing
    written."""
    from specmesh.tools.export import main

    out = tmp_path / "out"
    out.mkdir()
    _export_folder(out)
    before = sorted(tmp_path.rglob("*"))
    spec = "a=%s" % (out / "tiny.pt")
    assert main(["--out", str(out), "--model", spec, "--model", spec]) == 1
    assert capsys.readouterr().err == "export: --model %s: a is named twice (one checkpoint a NAME: each becomes " \
        "NAME.spm)\n" % spec
    assert sorted(tmp_path.rglob("*")) == before


def test_an_export_stopped_while_it_writes_the_reference_outputs_keeps_the_old_archive(tmp_path, monkeypatch):
    """reference.npz was written in place by numpy: a Ctrl-C while it wrote left half an archive, which the next
    export could not read."""
    from specmesh.tools import export

    _export_folder(tmp_path)
    assert export.main(["--out", str(tmp_path), "--model", "x=%s" % (tmp_path / "tiny.pt")]) == 0
    before = (tmp_path / "reference.npz").read_bytes()

    def stopped(file, **arrays):  # numpy's writer, stopped half-way: given a name it opens it as numpy does
        with contextlib.nullcontext(file) if hasattr(file, "write") else open(file, "wb") as f:
            f.write(b"PK\x03\x04 half an archive")
            raise KeyboardInterrupt

    monkeypatch.setattr(export.np, "savez_compressed", stopped)
    with pytest.raises(KeyboardInterrupt):
        export.main(["--out", str(tmp_path), "--model", "y=%s" % (tmp_path / "tiny.pt")])
    assert (tmp_path / "reference.npz").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heldout.txt", "reference.npz", "tiny.pt", "tokenizer.bin",
                                                          "vocab.bin", "x.spm", "y.spm"]


def test_an_export_stopped_while_it_computes_the_reference_outputs_writes_no_model_file(tmp_path, monkeypatch):
    """The model file was written before its reference outputs were computed (the float model's greedy runs and loss:
    minutes for a shipped drafter): a Ctrl-C meanwhile left the new model beside the old model's reference outputs,
    against which the tests check the int8 engines. The files are now written once every reference is computed."""
    from specmesh.tools import export

    _export_folder(tmp_path)
    assert export.main(["--out", str(tmp_path), "--model", "x=%s" % (tmp_path / "tiny.pt")]) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}

    def stopped(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(export, "reference", stopped)
    torch.manual_seed(1)  # another model under the same name
    m = Transformer(ModelArgs(dim=16, n_layers=1, n_heads=2, n_kv_heads=1, hidden=32, max_seq=80))
    torch.save({"model": m.state_dict(), "config": m.a.to_dict()}, tmp_path / "tiny.pt")
    before["tiny.pt"] = (tmp_path / "tiny.pt").read_bytes()
    with pytest.raises(KeyboardInterrupt):
        export.main(["--out", str(tmp_path), "--model", "x=%s" % (tmp_path / "tiny.pt")])
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.mark.parametrize("out, said", [("new", "has no vocab.bin, tokenizer.bin, heldout.txt"),
                                       ("file", "is not a folder")])
def test_export_to_a_folder_that_is_no_models_folder_says_what_out_is(tmp_path, capsys, out, said):
    """--out is where export reads the vocabulary, tokenizer and stories as well as where it writes: a new folder
    was "export: NEW/vocab.bin: No such file or directory", which did not say to give a models folder."""
    from specmesh.tools.export import main

    _export_folder(tmp_path)
    (tmp_path / "new").mkdir()
    (tmp_path / "file").write_text("")
    assert main(["--out", str(tmp_path / out), "--model", "x=%s" % (tmp_path / "tiny.pt")]) == 1
    assert capsys.readouterr().err == ("export: --out %s %s: give a models folder (models/, or a copy of it): export "
                                       "reads vocab.bin, tokenizer.bin, heldout.txt there and writes the models beside "
                                       "them\n" % (tmp_path / out, said))


def test_export_and_training_read_the_shipped_models_wherever_they_are_run_from(tmp_path, monkeypatch, capsys):
    """export, train and train_all read "models/" of the folder they were run in: from any other, export said
    "export: [Errno 2] No such file or directory: 'models/vocab.bin'" before looking at the checkpoint asked for.
    Each reads the package's models folder, as the other tools do."""
    from specmesh.host.layout import MODELS, TARGET_FILE
    from specmesh.tools import export, train, train_all

    monkeypatch.chdir(tmp_path)
    assert export.main(["--model", "x=%s" % (tmp_path / "missing.pt")]) == 1
    assert "missing.pt" in capsys.readouterr().err
    a = train.parser().parse_args(["--shape", sorted(train.DRAFTERS)[0], "--out", "ck"])
    assert (a.teacher, a.tokenizer, a.heldout) == (MODELS / TARGET_FILE, MODELS / "tokenizer.bin",
                                                   MODELS / "heldout.txt")
    assert all(p.is_file() for p in (a.teacher, a.tokenizer, a.heldout, train_all.MODELS / "vocab.bin"))
    assert train_all.OPENINGS == str(MODELS / "tinystories_train_head.txt")
