"""Checks before anything starts (host/cli/preflight.py, `specmesh emulate` flags): a corrupt model, an
over-long prompt, a missing port, emulator flags out of range. Each is one line on stderr, exit status 2,
within a second, and no virtual board is started (the default back-ends are virtual boards)."""

import shutil
import time
from pathlib import Path

import pytest

from specmesh.host import cli
from specmesh.host.cli.preflight import unknown_backend
from specmesh.host.emulator import board
from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.shared.modelfile import HEADER_SIZE
from specmesh.tools.testmodels import random_model

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def models(tmp_path):
    d = tmp_path / "models"
    d.mkdir()
    shutil.copy(ROOT / "models" / "tokenizer.bin", d / "tokenizer.bin")
    random_model(d / TARGET_FILE, vocab=512, max_seq=64, seed=1)
    random_model(d / DRAFTER_FILE, vocab=512, max_seq=32, seed=2)
    return d


@pytest.fixture
def no_board_starts(monkeypatch):
    """Fails the test if a virtual board is started; checks that none is left running."""

    def refuse(self, *args, **kwargs):
        raise AssertionError("a virtual board was started before the checks failed")

    monkeypatch.setattr(board.VirtualBoard, "start", refuse)
    yield
    assert not board._LIVE


def one_line_status_2(capsys, argv, within=1.0):
    t0 = time.monotonic()
    rc = cli.main(argv)
    took = time.monotonic() - t0
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert took < within, "the check took %.2f s" % took
    return err


def damage_crc(b):
    return b[:HEADER_SIZE + 40] + bytes([b[HEADER_SIZE + 40] ^ 0x55]) + b[HEADER_SIZE + 41:]


@pytest.mark.parametrize("name, damage, reason", [
    (TARGET_FILE, damage_crc, "fails its CRC check"),
    (DRAFTER_FILE, lambda b: b[:-100], "is truncated"),
    (TARGET_FILE, lambda b: b"GGUF" + b[4:], "not a specmesh model file"),
    (DRAFTER_FILE, lambda b: b[:HEADER_SIZE - 1], "truncated"),
])
def test_a_corrupt_model_is_named_with_its_reason(models, capsys, no_board_starts, name, damage, reason):
    path = models / name
    path.write_bytes(damage(path.read_bytes()))
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--max-tokens", "4"])
    assert str(path) in err and reason in err


def test_an_over_long_prompt_is_refused_before_the_boards_start(models, capsys, no_board_starts):
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--prompt", "Once upon a time " * 100])
    assert "the prompt is" in err and "target model's context holds 64 (target.spm)" in err
    assert "Once upon" not in capsys.readouterr().out  # the prompt was not echoed either


def test_only_the_targets_context_limits_the_prompt(models, capsys):
    """Past the drafter's context (32) rounds are plain: a prompt of 32..63 tokens runs."""
    from specmesh.host.decode.tokenizer import Tokenizer

    prompt = "Once upon a time " * 9
    n = len(Tokenizer.from_llama2c(models / "tokenizer.bin").encode(prompt))
    assert 32 <= n < 64
    rc = cli.main(["run", "--models", str(models), "--verifier", "cpu", "--drafter", "cpu", "--quiet",
                   "--max-tokens", "2", "--prompt", prompt])
    assert rc == 0, capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--drafter", "--verifier"])
def test_a_missing_port_is_refused_before_the_other_board_boots(models, capsys, no_board_starts, flag):
    err = one_line_status_2(capsys, ["run", "--models", str(models), flag, "/dev/ttyNOPE"])
    assert "cannot open /dev/ttyNOPE: no such port" in err and flag in err


def test_a_port_someone_holds_is_busy(models, capsys, no_board_starts):
    import os
    import pty

    master, slave = pty.openpty()
    try:
        import serial

        with serial.Serial(os.ttyname(slave), exclusive=True):
            err = one_line_status_2(capsys, ["run", "--models", str(models), "--drafter", os.ttyname(slave)])
    finally:
        os.close(master)
        os.close(slave)
    assert "busy" in err


def test_an_unknown_backend_is_refused_before_the_verifier_boots(models, capsys, no_board_starts):
    # not within 1 s: listing the known back-ends imports the torch plugin, when PyTorch is installed
    err = one_line_status_2(capsys, ["run", "--models", str(models), "--drafter", "nope"], within=30.0)
    assert "--drafter nope: not a serial port nor one of" in err


def test_boards_are_chosen_through_the_one_registry():
    """`virtual` and every serial-port name are back-ends of both roles in the registry's tables, as `cpu` is."""
    from specmesh.host import backends
    from specmesh.host.cli import registry

    for kind, table in (("verifier", registry.VERIFIERS), ("drafter", registry.DRAFTERS)):
        assert registry.factory(kind, "virtual") is table["virtual"]
        for port in ("/dev/ttyUSB0", "COM3", "auto", "rfc2217://lab:4000"):
            assert registry.factory(kind, port) is table[backends.PORT]
        assert registry.factory(kind, "cpu") is table["cpu"] and registry.factory(kind, "nope") is None
    known = unknown_backend("drafter", "nope").split("nor one of ")[1].split(", ")
    assert "virtual" in known and "cpu" in known and backends.PORT not in known


@pytest.mark.parametrize("flags, message", [
    (["--loss", "2"], "--loss is a probability"),
    (["--duplicate", "-0.1"], "--duplicate is a probability"),
    (["--reorder", "1"], "--reorder is a probability"),
    (["--flash-kb", "1"], "--flash-kb must be a multiple of 4 in 8..16384"),
    (["--flash-kb", "10"], "--flash-kb must be"),
    (["--delay-ms", "-5"], "--delay-ms must be in 0..10000"),
    (["--boards", "0"], "--boards must be in 1..64, not 0"),
])
def test_emulator_flags_out_of_range(capsys, no_board_starts, flags, message):
    err = one_line_status_2(capsys, ["emulate", *flags])
    assert err.startswith("specmesh emulate: error: ") and message in err
