"""The hardware-in-the-loop suite: what a user with boards checks after flashing them.

Against real boards: `SPECMESH_PORTS=DRAFTER_PORT,VERIFIER_PORT .venv/bin/pytest -m hil tests/test_hil.py`
(a classic ESP32 or an ESP32-S3 as the drafter, an ESP32-S3 with PSRAM as the verifier; the suite flashes
them). The same tests run in `make test` against two virtual boards flashed through the very same
mpremote path, so the suite a user relies on is never stale. In order: flash each role (then a second
flash finds every file's SHA-256 on the board unchanged), the boards answer with their role and model,
drafts and verdicts equal the host engine's, a speculative generation equals the host's target-only
text, and a verifier reset in the middle of a generation loses nothing.

`make test-rv32` runs the suite on two virtual ESP32-C3s (MicroPython's RV32 machine code under QEMU,
host/emulator/qemu.py), once with the native kernels and once with the viper ones (the native module removed
from the board, as on a board without it), and checks that their instruction counts are exact.
"""

import os
import time
from pathlib import Path

import pytest

from specmesh.host.backends import Draft, LocalDrafter, LocalVerifier, SessionParams
from specmesh.host.backends.board import kernel_name
from specmesh.host.cli.chaos import soft_reset
from specmesh.host.decode.gamma import GammaController
from specmesh.host.decode.orchestrator import generate
from specmesh.host.decode.tokenizer import Tokenizer
from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.host.projection.measured import board_summary
from specmesh.host.provision.cluster import connect
from specmesh.host.provision.flash import flash, native_module, open_board
from specmesh.shared import messages as m
from tests.conftest import require_rv32

MODELS = Path(__file__).resolve().parent.parent / "models"
ROLES = ("drafter", "verifier")
ARCH: dict[str, str | None] = {}  # role -> the flashed board's architecture (the flashed fixture's)
HOW = ("real boards: flash nothing yourself, connect a drafter and a verifier board and run "
       "SPECMESH_PORTS=DRAFTER_PORT,VERIFIER_PORT .venv/bin/pytest -m hil tests/test_hil.py")


KINDS = ["virtual", pytest.param("rv32-native", marks=pytest.mark.rv32),
         pytest.param("rv32-viper", marks=pytest.mark.rv32), pytest.param("real", marks=pytest.mark.hil)]


@pytest.fixture(scope="module", params=KINDS)
def kind(request) -> str:
    """Which boards: two unix-port virtual boards, two virtual ESP32-C3s (native or viper kernels), or real ones."""
    if request.param.startswith("rv32"):
        require_rv32()
    return request.param


@pytest.fixture(scope="module")
def ports(kind, tmp_path_factory) -> dict[str, str]:
    """{role: serial port}: two virtual boards (an ESP32 drafter, an ESP32-S3 verifier; or two ESP32-C3s under
    QEMU), or SPECMESH_PORTS."""
    if kind == "real":
        given = os.environ.get("SPECMESH_PORTS", "").split(",")
        if len(given) != 2 or not all(given):
            pytest.skip(HOW)
        yield dict(zip(ROLES, given))
        return
    from specmesh.host.emulator import make_board

    classes = ("esp32c3", "esp32c3") if kind.startswith("rv32") else ("esp32", "esp32s3")
    boards = [make_board(tmp_path_factory.mktemp(role), board, name="hil-" + role) for role, board in zip(ROLES, classes)]
    try:
        yield {role: vb.start().port for role, vb in zip(ROLES, boards)}
    finally:
        for vb in boards:
            vb.stop()


@pytest.fixture(scope="module")
def flashed(kind, ports) -> dict[str, str]:
    for role, port in ports.items():
        model = MODELS / (DRAFTER_FILE if role == "drafter" else TARGET_FILE)
        report = flash(port, role, model, progress=False)
        ARCH[role] = report.board.arch
        placed = {"/models/" + model.name, "/rom/" + model.name}  # the filesystem, or a board's ROMFS
        assert placed & set(report.written + report.unchanged)
        time.sleep(0.5)  # the board boots the node after its soft reset
        again = flash(port, role, model, progress=False)  # every file's SHA-256 on the board matches
        assert again.written == [] and len(again.unchanged) == len(report.written) + len(report.unchanged)
        time.sleep(0.5)
        if kind == "rv32-viper":  # a board without the native module runs the viper kernels
            transport = open_board(port)
            try:
                transport.fs_rmfile("/native/rv32imc.mpy")
                transport.exit_raw_repl()
                transport.serial.write(b"\x04")  # soft reset: the node starts again
            finally:
                transport.close()
            time.sleep(0.5)
    return ports


@pytest.fixture(scope="module")
def boards(flashed):
    with connect(flashed["drafter"], "drafter") as drafter, connect(flashed["verifier"], "verifier") as verifier:
        yield drafter, verifier


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    return Tokenizer.from_llama2c(MODELS / "tokenizer.bin").encode("Once upon a time, a little dog")


def test_boards_report_their_role_and_model(kind, boards):
    for board, role in zip(boards, (m.ROLE_DRAFTER, m.ROLE_VERIFIER)):
        hello = m.unpack_hello(board.proxy.call(m.HELLO).payload)
        fw, _board, got_role, model, vocab, max_seq, heap, _caps, _gmax, kernels = hello
        assert got_role == role and vocab == 512 and heap > 0 and fw
        # the native module flashed for its arch passed its self-test: the parity tests below run it (rv32-viper:
        # the module was removed after flashing, as on a board without it)
        role_name = ROLES[role - 1]
        native = native_module(ARCH[role_name]) and kind != "rv32-viper"
        assert kernels == ("native" if native else "viper (no native/%s.mpy)" % ARCH[role_name])
        assert model.endswith(DRAFTER_FILE if role == m.ROLE_DRAFTER else TARGET_FILE)
        # a node short of heap halves its context; a verifier without PSRAM (a C3) holds 80 positions
        assert max_seq == board.max_seq >= 80
        if kind.startswith("rv32"):  # the kernels the suite asked for, as the node says in HELLO
            assert kernel_name(kernels)[0] == kind.split("-")[1]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_drafts_and_verdicts_equal_the_host_engines(boards, prompt, temperature):
    drafter, verifier = boards
    host_d, host_v = LocalDrafter(MODELS / DRAFTER_FILE), LocalVerifier(MODELS / TARGET_FILE)
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


def test_a_verifier_reset_mid_generation_loses_nothing(boards, prompt):
    drafter, verifier = boards
    params = SessionParams(seed=3, temperature=0.7)
    want = generate(prompt, LocalVerifier(MODELS / TARGET_FILE), LocalDrafter(MODELS / DRAFTER_FILE), params, 24,
                    GammaController(fixed=2)).tokens
    rounds = []

    def reset_verifier(accepted, emitted):
        rounds.append(1)
        if len(rounds) == 3:
            soft_reset(verifier)

    before = verifier.resyncs
    got = generate(prompt, verifier, drafter, params, 24, GammaController(fixed=2), on_round=reset_verifier)
    assert got.tokens == want
    assert verifier.resyncs == before + 1


def test_the_board_counts_more_instructions_for_a_bigger_verify(kind, boards, prompt):
    """On a QEMU board the node counts each pass's executed instructions (firmware/cpucount.py): a verify of 4
    drafts (5 positions) executes more than plain decoding (1 position), and the board's STATS say so per size
    (tests/test_rv32.py shows a pass's count is the same every time)."""
    if not kind.startswith("rv32"):
        pytest.skip("executed instructions are counted on the QEMU boards only (make test-rv32)")
    _drafter, verifier = boards
    params = SessionParams(temperature=0.0)
    draft = LocalDrafter(MODELS / DRAFTER_FILE)
    draft.begin(params, prompt)
    last = {}
    for d in (Draft(len(prompt)), draft.draft(prompt, 4)):
        verifier.begin(params, prompt)
        verifier.verify(prompt, d)
        last[len(d) + 1] = verifier.stats()["insn_last"]
    assert last[5] > last[1] > 0
    per_pass = board_summary(verifier.stats(), 1)["instructions_per_pass"]
    assert per_pass["5"] > per_pass["1"] > 0
