"""tools/rowwidths.py: the packed rows of the shipped target's residual stream, measured over held-out text, and
the figures host/projection/hardware.py keeps for the pipeline projection (PACKED_ROW_BYTES)."""

from specmesh.host.backends.engine import Engine
from specmesh.host.layout import MODELS, TARGET_FILE
from specmesh.host.projection import hardware
from specmesh.tools import rowwidths


def test_hardware_figures_are_the_current_measurement():
    dim = Engine(MODELS / TARGET_FILE).header.dim
    assert dim == hardware.PACKED_ROW_DIM
    widths = rowwidths.measure()
    assert all(sum(c.values()) >= 500 for c in widths.values())  # rows enough to mean something
    assert rowwidths.mean_bytes(widths, dim) == hardware.PACKED_ROW_BYTES
    assert max(hardware.PACKED_ROW_BYTES.values()) < 4 * dim  # smaller than int32 rows: what the packing buys


def test_a_corrupt_model_is_one_line_not_a_traceback(monkeypatch, capsys):
    """The tools without their own handling of a bad model file (rowwidths, ngram_cost) get run_tool's: one line."""
    import pytest

    from specmesh.shared.modelfile import ModelFileError
    from specmesh.tools import run_tool

    def corrupt(path):
        raise ModelFileError("model file %s is truncated (456 of 276192 tensor bytes): copy it again" % path)

    monkeypatch.delenv("SPECMESH_DEBUG", raising=False)
    monkeypatch.setattr(rowwidths, "Engine", corrupt)
    with pytest.raises(SystemExit) as e:
        run_tool("rowwidths", rowwidths.main)
    err = capsys.readouterr().err
    assert e.value.code == 1 and err.startswith("rowwidths: model file ") and err.count("\n") == 1


def test_rowwidths_takes_no_flags_and_ngram_cost_names_a_missing_model(tmp_path):
    """`rowwidths --help` says what it measures (it ran the measurement), a stray flag is a usage error; `ngram_cost
    --model` naming no file says so (it said no n-gram table was beside it)."""
    import subprocess
    import sys

    from specmesh.host.layout import ROOT

    def tool(*args):
        return subprocess.run([sys.executable, "-m", "specmesh.tools." + args[0], *args[1:]], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)

    shown = tool("rowwidths", "--help")
    assert shown.returncode == 0 and "Bytes of a packed row" in shown.stdout and "after layer" not in shown.stdout
    assert tool("rowwidths", "--bogus").returncode == 2
    missing = tool("ngram_cost", "--model", str(tmp_path / "nope.spm"))
    assert (missing.returncode, missing.stderr) == (1, "ngram_cost: no model file %s: give --model a drafter's "
                                                    ".spm\n" % (tmp_path / "nope.spm"))


def test_a_held_out_file_that_is_not_utf8_is_named(tmp_path):
    """modelcard's held-out text, corrupt: the error names the file (the decoder's own message named none)."""
    import pytest

    from specmesh.tools.heldout import heldout_stories

    bad = tmp_path / "heldout.txt"
    bad.write_bytes(b"Once upon a time\xff\xfe\n")
    with pytest.raises(ValueError, match="heldout.txt is not UTF-8 text .byte 16.: restore it"):
        heldout_stories(bad)
