"""The RV32 classes and the projection from measured instructions (host/projection/measured.py), without QEMU:
the figures a node's STATS carry become per-pass means and the stats JSON's per-board summary, a pass size never
run is read off the line through those that were, and `--project esp32c3` prices a pass as its measured
instructions at the stated CPI and clock plus its weight bytes at the stated flash rate. `--project esp32s3` is
priced so when its roles run on the QEMU Xtensa boards (each role on its own board's class), from the cost model
on unix-port and real boards, and a mix is refused in one line."""

import pytest

from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.host.backends.modelio import check_model_file
from specmesh.host.boardclasses import BOARD_CLASSES, ESP32C3, ESP32C6
from specmesh.host.cli.run import UsageError, add_arguments, check_args
from specmesh.host.emulator.qemu import CONFIG_ADDR, CONFIG_MAGIC, RV32, XTENSA, QemuBoard, qemu_command
from specmesh.host.projection.costmodel import pass_work, weight_bytes
from specmesh.host.projection.hardware import BOARDS, CPI, RV32_CPI
from specmesh.host.projection.measured import MEASURED, Line, MeasuredProjector, board_summary, pass_counts
from tests.conftest import ROOT

STATS = {"insn_last": 2_300_123, "passes_k1": 4, "insn_k1": 9_200, "passes_k5": 2, "insn_k5": 13_600,
         "passes_k3": 0, "insn_k3": 0, "heap_free": 30_000}


def test_rv32_classes_carry_their_facts_and_run_under_qemu():
    assert ESP32C3.heap_bytes == 2 * 64_000 and ESP32C3.clock_hz == 160e6 and ESP32C3.isa == "rv32imc"
    assert ESP32C6.isa == "rv32imac" and ESP32C6.mpy_arch == "rv32imc"
    assert ESP32C3.romfs_bytes >= 300 * 1024  # holds the shipped target's image (276 KB of weights)
    assert {c.name for c in BOARD_CLASSES.values() if c.qemu} == {"esp32c3", "esp32c6"}
    assert {"esp32c3", "esp32c6"} <= set(BOARDS)
    assert QemuBoard(ROOT / "build" / "never-started", "esp32").machine is XTENSA  # an Xtensa class when named
    assert QemuBoard(ROOT / "build" / "never-started", "esp32c3").machine is RV32


def test_a_probed_board_gets_its_class_and_a_c3_drafts_with_the_heap_drafter():
    from specmesh.host.boardclasses import ESP32, ESP32S3, class_of, drafter_model

    assert class_of("ESP32C3 module with ESP32C3", 150_000) is ESP32C3
    assert class_of("ESP32C6 module with ESP32C6", 150_000) is ESP32C6
    assert class_of("Generic ESP32 module with ESP32", 100_000) is ESP32
    assert class_of(ESP32S3.machine, ESP32S3.heap_bytes) is ESP32S3
    assert class_of(ESP32S3.machine, 300_000) is ESP32  # an S3 without PSRAM holds what a classic ESP32 holds
    assert drafter_model(ROOT / "models", "esp32c3").name == ESP32.drafter  # measured: it pays there too


def test_the_qemu_command_counts_instructions_and_sizes_the_board(monkeypatch):
    monkeypatch.setattr("specmesh.host.emulator.qemu.qemu_binary", lambda *_: "qemu-system-riscv32")
    cmd = " ".join(qemu_command(ESP32C3.heap_bytes, ESP32C3.romfs_bytes))
    assert "-icount shift=0" in cmd and "-machine virt" in cmd and "-serial stdio" in cmd
    assert "loader,addr=%#x,data=%#x" % (CONFIG_ADDR, CONFIG_MAGIC) in cmd
    assert "data=%#x" % ESP32C3.heap_bytes in cmd and "file=romfs.img" in cmd


def test_stats_become_means_per_pass_and_a_board_summary():
    assert pass_counts(STATS) == {1: (4, 9_200_000), 5: (2, 13_600_000)}
    s = board_summary(STATS, tokens=8)
    assert s["instructions"] == MEASURED and s["instructions_last_pass"] == 2_300_123
    assert s["instructions_per_pass"] == {"1": 2_300_000, "5": 6_800_000}
    assert s["instructions_per_token"] == pytest.approx((9_200_000 + 13_600_000) / 8)
    assert board_summary({"heap_free": 1}, 8) == {}  # a board that does not count


def test_a_size_never_run_is_read_off_the_line():
    line = Line({1: 2_300_000.0, 5: 6_800_000.0})
    assert line(1) == 2_300_000 and line(3) == pytest.approx(4_550_000)
    assert Line({5: 5_000_000.0})(2) == pytest.approx(2_000_000)  # one size: proportional
    # a fixed gamma 4 run: its prefill (4 positions, a short context) and its verifies (5) tilt the line below 0 at
    # one position, which would price a plain pass at nothing: the line through 0 instead
    tilted = Line({4: 5_486_000.0, 5: 7_706_000.0})
    assert tilted(1) == pytest.approx((4 * 5_486_000 + 5 * 7_706_000) / 41) and tilted(4) == 5_486_000


def test_the_measured_projection_prices_instructions_and_flash_bytes():
    h = check_model_file(ROOT / "models" / TARGET_FILE)[0]
    p = MeasuredProjector(h, None, "esp32c3")
    with pytest.raises(ValueError, match="virtual:esp32c3"):
        p.terms(h, 1, 10)
    p.measure("verifier", STATS, "/rom/target.spm")
    terms = p.terms(h, 1, 10)
    assert terms["compute"] == pytest.approx(2_300_000 * RV32_CPI.value / 160e6)
    assert terms["weights_flash"] == pytest.approx(weight_bytes(h) / BOARDS["esp32c3"].flash_map_bps.value)
    p.measure("verifier", STATS, "models/target.spm")  # a model in the heap reads no flash per pass
    assert p.terms(h, 1, 10)["weights_flash"] == 0.0
    assert p.unmeasured == {}
    p.terms(h, 3, 10)  # a size the run never ran, read off the line: said in the projection
    assert p.unmeasured == {"verifier": {3}}


def test_an_xtensa_class_prices_instructions_at_its_cpi_and_the_psram_bytes():
    """--project esp32s3 from an Xtensa board's counts: the S3's CPI and clock, and the target's weights
    and KV rows from PSRAM at the class's rate (no flash read: the S3 keeps it in PSRAM)."""
    h = check_model_file(ROOT / "models" / TARGET_FILE)[0]
    p = MeasuredProjector(h, None, "esp32s3")
    p.measure("verifier", STATS, "models/target.spm")
    terms = p.terms(h, 1, 10)
    s3 = BOARDS["esp32s3"]
    assert terms["compute"] == pytest.approx(2_300_000 * CPI.value / s3.clock_hz.value)
    work = pass_work(h, 1, 10)
    assert terms["weights_psram"] == pytest.approx(work["weights_psram"] / s3.weight_stream_bps.value)
    assert terms["kv_psram"] == pytest.approx(work["kv_psram"] / s3.weight_stream_bps.value)
    assert terms["weights_flash"] == 0.0


def test_a_measured_drafter_pass_is_priced_from_its_own_line():
    """A C3 drafter and a C3 verifier: the drafter's pass is what the drafter board executed (the speculative
    projection asks for it as on any board)."""
    target = check_model_file(ROOT / "models" / TARGET_FILE)[0]
    drafter = check_model_file(ROOT / "models" / DRAFTER_FILE)[0]
    p = MeasuredProjector(target, drafter, "esp32c3")
    p.measure("verifier", STATS, "/rom/target.spm")
    p.measure("drafter", {"passes_k1": 2, "insn_k1": 300, "heap_free": 80_000}, "/rom/drafter.spm")
    assert p.draft_pass(10) == pytest.approx(150_000 * RV32_CPI.value / 160e6
                                             + weight_bytes(drafter) / BOARDS["esp32c3"].flash_map_bps.value)
    assert p.drafter_board.name == "esp32c3"  # the stats name the drafter's own class


class CountingBoard:
    """A board back-end whose STATS grow as passes of new sizes run; counts the STATS exchanges."""

    def __init__(self, model: str, counts: dict[int, int]):
        self.info = {"model": model}
        self.counts = counts
        self.asked = 0

    def stats(self) -> dict:
        self.asked += 1
        return {"heap_free": 1, **{"passes_k%d" % k: 1 for k in self.counts},
                **{"insn_k%d" % k: v for k, v in self.counts.items()}}


def test_live_costs_ask_the_boards_only_for_pass_sizes_not_measured_yet():
    from specmesh.host.decode.orchestrator import Round
    from specmesh.host.projection.measured import LiveCosts

    target = check_model_file(ROOT / "models" / TARGET_FILE)[0]
    drafter = check_model_file(ROOT / "models" / DRAFTER_FILE)[0]
    ver, dra = CountingBoard("/rom/target.spm", {1: 2_000}), CountingBoard("/models/drafter.spm", {1: 700})
    live = LiveCosts(MeasuredProjector(target, drafter, "esp32c3"), [("verifier", ver), ("drafter", dra)])
    assert not live.known_beforehand and live.pipelined and live.board.name == "esp32c3"

    def rnd(gamma):
        return Round(gamma=gamma, n_accepted=gamma, n_committed=gamma + 1, pos0=20, draft_body=3 + gamma * 2,
                     verify_body=4 + gamma)

    plain = live.round_costs(rnd(0))
    assert ver.asked == 1 and plain[0] == 0.0 and plain[1] > 2_000_000 * RV32_CPI.value / 160e6
    live.round_costs(rnd(0))
    assert ver.asked == 1  # size 1 is measured: no exchange
    ver.counts[4] = 5_000
    t_draft, t_verify, _ = live.round_costs(rnd(3))  # size 4 is new: the boards are asked again
    assert ver.asked == 2 and t_verify > plain[1]
    assert t_draft >= 3 * 700_000 * RV32_CPI.value / 160e6  # three heap-resident passes, no flash term


def test_live_costs_open_on_the_class_cost_model_until_the_boards_have_run_passes():
    """An Xtensa pair: before any pass the class's cost model prices a round (the controller is primed on it,
    not left to probe plain and short rounds first); once the boards have run passes, what they executed."""
    from specmesh.host.decode.orchestrator import Round
    from specmesh.host.projection.measured import LiveCosts
    from specmesh.host.projection.rounds import Projector

    target = check_model_file(ROOT / "models" / TARGET_FILE)[0]
    drafter = check_model_file(ROOT / "models" / DRAFTER_FILE)[0]
    ver, dra = CountingBoard("/models/target.spm", {}), CountingBoard("/models/drafter.spm", {})
    prior = Projector(target, drafter, "esp32s3", drafter_board="esp32")
    measured = MeasuredProjector(target, drafter, "esp32s3", drafter_board="esp32")
    live = LiveCosts(measured, [("verifier", ver), ("drafter", dra)], prior)
    assert live.known_beforehand
    probe = Round(gamma=4, n_accepted=4, n_committed=5, pos0=5, draft_body=11, verify_body=8)
    assert live.round_costs(probe) == prior.round_costs(probe)
    ver.counts.update({1: 2_000, 5: 6_000})
    dra.counts[1] = 700
    assert live.round_costs(probe) == measured.round_costs(probe) != prior.round_costs(probe)


@pytest.mark.parametrize("argv, message", [
    (["--project", "esp32c3", "--verifier", "cpu", "--plain"], "virtual:esp32c3"),
    (["--project", "esp32c3", "--verifier", "virtual:esp32c3"], "--drafter"),
])
def test_project_esp32c3_needs_c3_boards(argv, message):
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    with pytest.raises(UsageError, match=message):
        check_args(p.parse_args(argv))


def _config(argv):
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    return check_args(p.parse_args(argv))


XTENSA_PAIR = ["--drafter", "virtual:esp32", "--verifier", "virtual:esp32s3", "--project", "esp32s3"]


@pytest.mark.parametrize("argv, measured", [
    (XTENSA_PAIR, True),  # the Done-when command: an ESP32 drafter board beside the S3 verifier
    (["--plain", "--verifier", "virtual:esp32s3", "--project", "esp32s3"], True),
    (["--drafter", "cpu", "--verifier", "virtual:esp32s3", "--project", "esp32s3"], True),
    (["--drafter", "virtual:esp32s3", "--verifier", "virtual:esp32s3", "--project", "esp32s3"], True),
    (["--project", "esp32s3"], False),  # the fast unix-port boards: the cost model
    (["--drafter", "cpu", "--verifier", "virtual", "--project", "esp32s3"], False),
    (["--verifier", "/dev/ttyUSB0", "--drafter", "/dev/ttyUSB1", "--project", "esp32s3"], False),  # real boards
    (["--stages", "5", "--verifier", "virtual:esp32s3", "--project", "esp32s3"], False),  # the pipeline's own model
    (["--drafter", "virtual:esp32c3", "--verifier", "virtual:esp32c3", "--project", "esp32c3"], True),
])
def test_project_esp32s3_prices_qemu_boards_from_their_counts_and_the_rest_from_the_model(argv, measured):
    assert _config(argv).measured_projection is measured


@pytest.mark.parametrize("argv, message", [
    (["--plain", "--verifier", "virtual:esp32", "--project", "esp32s3"], "run the verifier on virtual:esp32s3"),
    (["--plain", "--verifier", "virtual:esp32s3", "--project", "esp32"], "run the verifier on virtual:esp32,"),
    (["--verifier", "virtual:esp32s3", "--project", "esp32s3"], "run the drafter on virtual:esp32 or "),
    (["--drafter", "virtual:esp32", "--verifier", "virtual", "--project", "esp32s3"], "not virtual "),
    (XTENSA_PAIR + ["--calibration", "cal.json"], "drop --calibration"),
    (XTENSA_PAIR + ["--kernels", "viper"], "drop --kernels"),
    (["--plain", "--verifier", "virtual:esp32s3", "--project", "esp32c3"], "virtual:esp32c3"),
])
def test_project_esp32s3_refuses_a_mix_of_qemu_and_other_boards_in_one_line(argv, message):
    with pytest.raises(UsageError, match=message) as e:
        _config(argv)
    assert "\n" not in str(e.value)


class _Board:
    """A board back-end of a class, reporting no counts until asked (LiveCosts asks lazily)."""

    def __init__(self, model: str):
        self.info = {"model": model}

    def stats(self) -> dict:
        return {"heap_free": 1}


@pytest.mark.parametrize("drafter, on_host", [("virtual:esp32", False), ("cpu", True)])
def test_the_xtensa_pair_plans_gamma_on_live_measured_costs_each_role_on_its_own_class(drafter, on_host):
    """gamma auto on QEMU Xtensa boards is fed LiveCosts (as the C3 pair's): the verifier priced as an S3, the
    drafter board as a classic ESP32 (its own clock and console), a cpu drafter on the host and never asked."""
    from specmesh.host.cli.session import projection
    from specmesh.host.projection.hardware import HOST_DRAFT_POSITION
    from specmesh.host.projection.measured import LiveCosts

    target = check_model_file(ROOT / "models" / TARGET_FILE)[0]
    small = check_model_file(ROOT / "models" / BOARD_CLASSES["esp32"].drafter)[0]
    config = _config(["--drafter", drafter, "--verifier", "virtual:esp32s3", "--project", "esp32s3"])
    costs, projector = projection(config, {"verifier": target, "drafter": small}, _Board("target.spm"),
                                  None if on_host else _Board("drafter-esp32.spm"), on_host, deterministic=False)
    assert isinstance(costs, LiveCosts) and costs.projector is projector and isinstance(projector, MeasuredProjector)
    assert projector.board.name == "esp32s3" and projector.drafter_on_host is on_host
    assert [role for role, _ in costs.boards] == (["verifier"] if on_host else ["verifier", "drafter"])
    projector.measure("verifier", STATS, "target.spm")
    if on_host:
        assert projector.draft_passes(10, 2) == [HOST_DRAFT_POSITION.value] * 2
        return
    assert projector.drafter_board.name == "esp32" and projector.links["drafter"][0].name == "uart0-console"
    projector.measure("drafter", {"passes_k1": 2, "insn_k1": 400}, "drafter-esp32.spm")
    esp32 = BOARDS["esp32"]
    assert projector.draft_pass(10) == pytest.approx(200_000 * CPI.value / esp32.clock_hz.value)
    seeded = projection(config, {"verifier": target, "drafter": small}, _Board("t"), _Board("d"), False, True)[0]
    assert not isinstance(seeded, LiveCosts) and seeded.drafter_board.name == "esp32"  # a seed gives one text


def test_a_unix_port_pair_keeps_the_cost_model():
    from specmesh.host.cli.session import projection
    from specmesh.host.projection.rounds import Projector

    target = check_model_file(ROOT / "models" / TARGET_FILE)[0]
    small = check_model_file(ROOT / "models" / BOARD_CLASSES["esp32"].drafter)[0]
    costs, projector = projection(_config(["--project", "esp32s3"]), {"verifier": target, "drafter": small},
                                  _Board("t"), _Board("d"), False, False)
    assert type(projector) is Projector and costs is projector
