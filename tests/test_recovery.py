"""The recovery paths the docs promise, each walked: a planted truncated module on a virtual board's flash
(docs/emulator.md: started afresh, with a line saying so), a board left at the REPL (a soft reset brings the
node back), two runs on one flash folder (a lock: the second is told, nothing collides)."""

import pytest

from specmesh.host.emulator import board as board_mod
from specmesh.host.layout import DRAFTER_FILE
from specmesh.host.provision.cluster import Cluster


def test_a_truncated_module_on_a_virtual_boards_flash_is_healed_with_a_line(models, tmp_path, monkeypatch):
    with Cluster("serial", models, tmp_path) as c:
        c.start("drafter")
    codec = tmp_path / "drafter" / "shared" / "codec.mpy"
    codec.write_bytes(codec.read_bytes()[:300])  # what an interrupted copy of an older specmesh left
    monkeypatch.setattr(board_mod, "MEASURE_S", 8)  # the hang is told from a slow import by this deadline
    lines = []
    with Cluster("serial", models, tmp_path, say=lines.append) as c:
        drafter = c.backend("drafter")
        assert drafter.info.get("model", "").endswith(DRAFTER_FILE)
    assert any("does not load" in line and "starting it with an empty flash" in line for line in lines), lines
    assert len(codec.read_bytes()) > 300  # flashed whole again
