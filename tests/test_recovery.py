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


def test_a_dead_espnow_verifier_is_replaced_by_the_cpu_and_the_table_names_both(models, tmp_path):
    """The verifier board behind the gateway dies mid-run: the CPU verifier takes over on the committed prefix,
    the text is the one the CPU alone gives, and the stats name the verifier that finished and the dead one."""
    from specmesh.host.backends import LocalVerifier, SessionParams
    from specmesh.host.cli.output import _took_over
    from specmesh.host.decode.gamma import GammaController
    from specmesh.host.decode.orchestrator import generate
    from specmesh.host.layout import TARGET_FILE

    params = SessionParams(temperature=0.0)
    prompt = [5, 17, 3]
    cpu = LocalVerifier(models / TARGET_FILE)
    want = generate(prompt, cpu, None, params, 24).tokens
    with Cluster("espnow", models, tmp_path) as c:
        verifier, drafter = c.backend("verifier"), c.backend("drafter")
        for bus in c.buses:
            bus.deadline = 3.0  # the dead board is given up on sooner than a run's 30 s
        rounds = []

        def kill_after_two(*_):
            rounds.append(1)
            if len(rounds) == 2:
                c.boards["verifier"].stop()

        result = generate(prompt, verifier, drafter, params, 24, GammaController(fixed=2), on_round=kill_after_two,
                          fallback=lambda: LocalVerifier(models / TARGET_FILE))
    assert result.tokens == want
    assert result.failed == {"verifier": verifier.name} and len(result.failovers) == 1
    assert "cpu took over" in result.failovers[0]
    stats = {"verifier": "cpu", "failed": result.failed}
    assert _took_over(stats, "verifier") == "cpu, which took over from %s (it failed)" % verifier.name
