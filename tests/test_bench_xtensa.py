"""tools/bench/xtensa.py: the Xtensa section says why it is skipped without QEMU or a firmware, and with
them (opt-in: SPECMESH_XTENSA_ELF, see tests/test_xtensa_native_module.py) prints executed next to counted
instructions per MAC, where the native matmul's executed figures cover at least its counted inner loop (viper's
count is a longest path through branches, so it may run fewer)."""

import os
import shutil

import pytest

from specmesh.host.projection import hardware
from specmesh.tools.bench import xtensa


def test_without_a_firmware_the_section_says_how_to_run_it(monkeypatch, capsys):
    monkeypatch.delenv("SPECMESH_XTENSA_ELF", raising=False)
    out = xtensa.run()
    assert "skipped" in out
    assert "skipped: " in capsys.readouterr().out


@pytest.mark.skipif(not os.environ.get("SPECMESH_XTENSA_ELF") or shutil.which(xtensa.QEMU) is None,
                    reason="set SPECMESH_XTENSA_ELF (and install qemu-system-misc) to run the matmul on Xtensa")
def test_executed_instructions_cover_the_counted_loops(capsys):
    out = xtensa.run()
    assert set(out["executed"]) == {"native", "viper"}
    counted = out["counted"]["native"]
    for k in (1, 5):
        for shape in ("512x64", "64x172"):
            if isinstance(counted, dict):
                assert out["executed"]["native"][shape][k] >= counted[k]
    assert "executed" in capsys.readouterr().out


@pytest.mark.skipif(not os.environ.get("SPECMESH_XTENSA_ELF") or shutil.which(xtensa.QEMU) is None,
                    reason="set SPECMESH_XTENSA_ELF (and install qemu-system-misc) to run the kernels on Xtensa")
def test_the_projection_s_native_figures_are_the_executed_ones():
    """hardware.NATIVE_XTENSA holds what the bench fits to the module's executed instructions (within the
    few percent a collection or a tick of CCOUNT moves them)."""
    units = xtensa.run()["native_units"]
    assert set(units) == set(hardware.NATIVE_XTENSA)
    for name, value in units.items():
        stored = hardware.NATIVE_XTENSA[name]
        pairs = [(value[g], stored[g]) for g in value] if isinstance(value, dict) else [(value, stored)]
        for got, want in pairs:
            assert abs(got - want) <= 0.05 * want + 1, name
