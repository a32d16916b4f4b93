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
