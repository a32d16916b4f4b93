"""The hardware-in-the-loop suite: what a user with boards checks after flashing them.

Against real boards: `SPECMESH_PORTS=DRAFTER_PORT,VERIFIER_PORT .venv/bin/pytest -m hil tests/test_hil.py`
(a classic ESP32 or an ESP32-S3 as the drafter, an ESP32-S3 with PSRAM as the verifier; the suite flashes
them). The same tests run in `make test` against two virtual boards flashed through the very same
mpremote path (and again with a drafter board on stock firmware, without ROMFS), so the suite a user
relies on is never stale. In order: flash each role (then a second
flash finds every file's SHA-256 on the board unchanged), the boards answer with their role and model,
drafts and verdicts equal the host engine's, a speculative generation equals the host's target-only
text, and a verifier reset in the middle of a generation loses nothing.

`make test-rv32` runs the suite on two virtual ESP32-C3s (MicroPython's RV32 machine code under QEMU,
host/emulator/qemu.py), once with the native kernels and once with the viper ones (the native module removed
from the board, as on a board without it), and checks that they count the instructions they execute;
`make test-xtensa` the same on a virtual ESP32 and ESP32-S3 (the ESP32's Xtensa machine code under QEMU).
"""

import os
import time
from pathlib import Path

import pytest

from specmesh.host.backends import Draft, LocalDrafter, LocalVerifier, SessionParams
from specmesh.host.cli.chaos import soft_reset
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import Observer, generate
from specmesh.host.decode.tokenizer import Tokenizer
from specmesh.host.layout import TARGET_FILE
from specmesh.host.projection.measured import board_summary
from specmesh.host.provision import drafters
from specmesh.host.provision.cluster import connect
from specmesh.host.provision.flash import flash, native_module, open_board
from specmesh.shared import messages as m
from tests.conftest import require_rv32, require_xtensa

MODELS = Path(__file__).resolve().parent.parent / "models"
ROLES = ("drafter", "verifier")
ARCH: dict[str, str | None] = {}  # role -> the flashed board's architecture (the flashed fixture's)
KIND = [""]  # the boards the module's tests run on now (the ports fixture's parameter)
QEMU_KINDS = ("rv32", "xtensa")  # the kinds of boards that run their class's own machine code under QEMU
HOW = ("real boards: flash nothing yourself, connect a drafter and a verifier board and run "
       "SPECMESH_PORTS=DRAFTER_PORT,VERIFIER_PORT .venv/bin/pytest -m hil tests/test_hil.py")


@pytest.fixture(scope="module", params=["virtual", "stock", pytest.param("rv32-native", marks=pytest.mark.rv32),
                                        pytest.param("rv32-viper", marks=pytest.mark.rv32),
                                        pytest.param("xtensa-native", marks=pytest.mark.xtensa),
                                        pytest.param("xtensa-viper", marks=pytest.mark.xtensa),
                                        pytest.param("real", marks=pytest.mark.hil)])
def ports(request, tmp_path_factory) -> dict[str, str]:
    """{role: serial port}: two virtual boards (an ESP32 drafter, an ESP32-S3 verifier; "stock": the ESP32
    without a ROMFS partition, as MicroPython's downloads: it runs its class's heap drafter all the same;
    "rv32-*": two ESP32-C3s under QEMU; "xtensa-*": an ESP32 and an ESP32-S3 under QEMU), or SPECMESH_PORTS."""
    KIND[0] = request.param
    if request.param.startswith(QEMU_KINDS):
        (require_rv32 if request.param.startswith("rv32") else require_xtensa)()
        from specmesh.host.emulator import make_board

        classes = ("esp32c3", "esp32c3") if request.param.startswith("rv32") else ("esp32", "esp32s3")
        boards = [make_board(tmp_path_factory.mktemp(role), cls, qemu=True, name="hil-" + role)
                  for role, cls in zip(ROLES, classes)]
        try:
            yield {role: vb.start().port for role, vb in zip(ROLES, boards)}
        finally:
            for vb in boards:
                vb.stop()
        return
    if request.param == "real":
        given = os.environ.get("SPECMESH_PORTS", "").split(",")
        if len(given) != 2 or not all(given):
            pytest.skip(HOW)
        yield dict(zip(ROLES, given))
        return
    from specmesh.host.emulator import VirtualBoard

    romfs = {"drafter": 0 if request.param == "stock" else None, "verifier": None}  # None: the class's
    boards = [VirtualBoard(tmp_path_factory.mktemp(role), board, name="hil-" + role, romfs_bytes=romfs[role])
              for role, board in zip(ROLES, ("esp32", "esp32s3"))]
    try:
        yield {role: vb.start().port for role, vb in zip(ROLES, boards)}
    finally:
        for vb in boards:
            vb.stop()


@pytest.fixture(scope="module")
def flashed(ports) -> dict[str, Path]:
    """Flash both boards; the model file each runs (the drafter's: the shipped one flash picks for the
    board's class, drafter-esp32.spm on a classic ESP32, host/boardclasses.py)."""
    models = {}
    for role, port in ports.items():
        given = None if role == "drafter" else MODELS / TARGET_FILE
        report = flash(port, role, given, progress=False)
        model = MODELS / report.model
        ARCH[role] = report.board.arch
        placed = {"/models/" + model.name, "/rom/" + model.name}  # the filesystem, or a board's ROMFS
        assert placed & set(report.written + report.unchanged)
        time.sleep(0.5)  # the board boots the node after its soft reset
        again = flash(port, role, given, progress=False)  # every file's SHA-256 on the board matches
        assert again.written == [] and len(again.unchanged) == len(report.written) + len(report.unchanged)
        time.sleep(0.5)
        if KIND[0].endswith("-viper"):  # a board without the native module runs the viper kernels
            transport = open_board(port)
            try:
                transport.fs_rmfile("/native/%s.mpy" % ARCH[role])
                transport.exit_raw_repl()
                transport.serial.write(b"\x04")  # soft reset: the node starts again
            finally:
                transport.close()
            time.sleep(0.5)
        models[role] = model
    return models


@pytest.fixture(scope="module")
def drafter_model(flashed) -> Path:
    return flashed["drafter"]


@pytest.fixture(scope="module")
def boards(ports, flashed):
    with connect(ports["drafter"], "drafter") as drafter, connect(ports["verifier"], "verifier") as verifier:
        yield drafter, verifier


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return Tokenizer.from_llama2c(MODELS / "tokenizer.bin").encode("Once upon a time, a little dog")


def test_flash_gives_the_drafter_board_the_drafter_its_firmware_runs(request, drafter_model):
    board = request.node.callspec.params["ports"]  # a real board gets either, as its firmware allows
    wide, heap = drafters.WIDE.file, drafters.HEAP.file
    assert drafter_model.name in {"virtual": {heap}, "stock": {heap}}.get(board, {wide, heap})


def test_boards_report_their_role_and_model(boards, drafter_model):
    for board, role in zip(boards, (m.ROLE_DRAFTER, m.ROLE_VERIFIER)):
        hello = m.unpack_hello(board.proxy.call(m.HELLO).payload)
        fw, _board, got_role, model, vocab, max_seq, heap, _caps, _gmax, kernels, _crc = hello
        assert got_role == role and vocab == 512 and heap > 0 and fw
        # the native module flashed for its arch passed its self-test: the parity tests below run it (rv32-viper:
        # the module was removed after flashing, as on a board without it)
        role_name = ROLES[role - 1]
        native = native_module(ARCH[role_name]) and not KIND[0].endswith("-viper")
        assert kernels == ("native" if native else "viper (no native/%s.mpy)" % ARCH[role_name])
        assert model.endswith(drafter_model.name if role == m.ROLE_DRAFTER else TARGET_FILE)
        # a node short of heap halves its context; a verifier without PSRAM (a C3) holds 80 positions
        assert max_seq == board.max_seq >= (80 if KIND[0].startswith("rv32") else 128)


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_drafts_and_verdicts_equal_the_host_engines(boards, prompt, temperature, drafter_model):
    drafter, verifier = boards
    host_d, host_v = LocalDrafter(drafter_model), LocalVerifier(MODELS / TARGET_FILE)
    params = SessionParams(seed=11, temperature=temperature)
    for backend in (drafter, host_d, verifier, host_v):
        backend.begin(params, prompt)
    got, want = drafter.draft(prompt, 4), host_d.draft(prompt, 4)
    assert (got.pos0, got.tokens, got.q) == (want.pos0, want.tokens, want.q)
    for draft in (got, Draft(len(prompt))):
        assert verifier.verify(prompt, draft) == host_v.verify(prompt, draft)


def test_speculative_generation_equals_the_hosts_target_only_text(boards, prompt):
    drafter, verifier = boards
    params = SessionParams(temperature=0.0)
    host = generate(prompt, LocalVerifier(MODELS / TARGET_FILE), None, params, 32).tokens
    assert generate(prompt, verifier, drafter, params, 32, GammaController(fixed=3)).tokens == host


def test_a_verifier_reset_mid_generation_loses_nothing(boards, prompt, drafter_model):
    drafter, verifier = boards
    params = SessionParams(seed=3, temperature=0.7)
    want = generate(prompt, LocalVerifier(MODELS / TARGET_FILE), LocalDrafter(drafter_model), params, 24,
                    GammaController(fixed=2)).tokens
    rounds = []

    class ResetVerifier(Observer):
        def shown(self, accepted, emitted):
            rounds.append(1)
            if len(rounds) == 3:
                soft_reset(verifier)

    before = verifier.resyncs
    got = generate(prompt, verifier, drafter, params, 24, GammaController(fixed=2), ResetVerifier())
    assert got.tokens == want
    assert verifier.resyncs == before + 1


def test_the_board_counts_more_instructions_for_a_bigger_verify(boards, prompt, drafter_model):
    """On a QEMU board the node counts each pass's executed instructions (firmware/cpucount.py): a verify of 4
    drafts (5 positions) executes more than plain decoding (1 position), and the board's STATS say so per size
    (tests/test_rv32.py shows a kernel call's count is the same every time)."""
    if not KIND[0].startswith(QEMU_KINDS):
        pytest.skip("executed instructions are counted on the QEMU boards only (make test-rv32, make test-xtensa)")
    _drafter, verifier = boards
    params = SessionParams(temperature=0.0)
    draft = LocalDrafter(drafter_model)
    draft.begin(params, prompt)
    last = {}
    for d in (Draft(len(prompt)), draft.draft(prompt, 4)):
        verifier.begin(params, prompt)
        verifier.verify(prompt, d)
        last[len(d) + 1] = verifier.stats()["insn_last"]
    assert last[5] > last[1] > 0
    per_pass = board_summary(verifier.stats(), 1)["instructions_per_pass"]
    assert per_pass["5"] > per_pass["1"] > 0
