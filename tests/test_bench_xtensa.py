"""tools/bench/xtensa.py: the Xtensa section says why it is skipped without QEMU, and on the shipped board (a
virtual ESP32-S3, one boot for the module) prints executed next to counted instructions per MAC, where the
native matmul's executed figures cover at least its counted inner loop (viper's count is a longest path through
branches, so it may run fewer), and fits host/projection/hardware.py NATIVE_XTENSA's figures."""

import pytest

from specmesh.host.projection import hardware
from specmesh.tools.bench import xtensa
from tests.conftest import require_xtensa


def test_without_qemu_the_section_says_what_to_install(monkeypatch, capsys):
    monkeypatch.setattr(xtensa.shutil, "which", lambda name: None)
    out = xtensa.run()
    assert "skipped" in out
    assert "skipped: qemu-system-xtensa is not installed" in capsys.readouterr().out


@pytest.fixture(scope="module")
def bench():
    require_xtensa()
    return xtensa.run()


@pytest.mark.xtensa
def test_executed_instructions_cover_the_counted_loops(bench, capsys):
    assert set(bench["executed"]) == {"native", "viper"}
    counted = bench["counted"]["native"]
    for k in (1, 5):
        for figure in ("per_mac_call", "per_mac"):
            if isinstance(counted, dict):
                assert bench["executed"]["native"][figure][k] >= counted[k]
    for name in ("native", "viper"):
        assert set(bench["executed"][name]["passes"]) == {1, 5}


@pytest.mark.xtensa
def test_the_projection_s_native_figures_are_the_executed_ones(bench):
    """hardware.NATIVE_XTENSA holds what the bench fits to the module's executed instructions (within the
    few percent a collection or a tick of the counter moves them)."""
    units = bench["native_units"]
    assert set(units) == set(hardware.NATIVE_XTENSA)
    for name, value in units.items():
        stored = hardware.NATIVE_XTENSA[name]
        pairs = [(value[g], stored[g]) for g in value] if isinstance(value, dict) else [(value, stored)]
        for got, want in pairs:
            assert abs(got - want) <= 0.05 * want + 1, name
