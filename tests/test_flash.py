"""Flashing virtual boards through the real path (mpy-cross, mpremote, hash check, reset), and its errors."""

import json
import os
import pty

import pytest

from emulator_util import mpremote, open_port, read_until
from host import cli
from host.bus.ports import PortError, resolve_port
from host.provision.flash import ROOT, BoardInfo, FlashError, check_board, flash, node_sources
from tools.testmodels import random_model

ECHO_MAIN = (
    "import sys, json\n"
    "import greet\n"
    "cfg = json.load(open('specmesh.json'))\n"
    "print('node up:', cfg['role'], cfg['node_id'], greet.hello(), greet.__file__)\n"
)
GREET = "import micropython\n\n@micropython.viper\ndef add(a: int, b: int) -> int:\n    return a + b\n\n" \
        "def hello():\n    return 'sum=%d' % add(40, 2)\n"


@pytest.fixture
def tiny_node(tmp_path):
    """A stand-in node: main.py that echoes its config, and a module with viper code; a small random model."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "main.py").write_text(ECHO_MAIN)
    (src / "greet.py").write_text(GREET)
    model = tmp_path / "drafter.spm"
    random_model(model)
    return [(src / "main.py", "/main.py"), (src / "greet.py", "/greet.py")], model


def test_flash_copies_verifies_and_starts_the_node(virtual_board, tiny_node):
    sources, model = tiny_node
    vb = virtual_board()
    report = flash(vb.port, "drafter", model, node_id=7, sources=sources, progress=False)
    assert report.board.arch == "x64" and report.board.virtual
    assert set(report.written) == {"/main.py", "/greet.mpy", "/models/drafter.spm", "/specmesh.json"}
    assert (vb.flash_dir / "greet.mpy").read_bytes()[:2] == b"M\x06"  # precompiled, .mpy v6
    assert (vb.flash_dir / "models" / "drafter.spm").read_bytes() == model.read_bytes()
    config = json.loads((vb.flash_dir / "specmesh.json").read_text())
    assert config == {"role": "drafter", "node_id": 7, "model": "models/drafter.spm"}
    with open_port(vb.port) as ser:  # the reset after flashing started main.py; reset again to watch it
        ser.write(b"\x03\x02")
        read_until(ser, b">>> ")
        ser.write(b"\x04")
        out = read_until(ser, b"greet.mpy\n")
        assert b"node up: drafter 7 sum=42" in out
    again = flash(vb.port, "drafter", model, node_id=7, sources=sources, progress=False)
    assert again.written == [] and len(again.unchanged) == 4


def test_flashed_firmware_node_answers(virtual_board, tmp_path):
    from host.provision.cluster import _open, discover

    vb = virtual_board()
    model = ROOT / "models" / "drafter.spm"
    report = flash(vb.port, "drafter", model, node_id=1, progress=False)
    assert {dest for _, dest in node_sources()} <= {d[:-4] + ".py" if d.endswith(".mpy") else d
                                                    for d in report.written}
    import contextlib

    with contextlib.ExitStack() as stack:
        assert discover(_open(vb.port, stack)) == 1


def test_full_filesystem_is_one_line_and_the_board_stays_usable(virtual_board, tiny_node, tmp_path):
    sources, _ = tiny_node
    vb = virtual_board("esp32s3", flash_bytes=64 * 1024)  # heap enough for the model, flash not
    big = tmp_path / "drafter.spm"
    random_model(big, dim=64, n_layers=4, hidden=172, vocab=512)  # 263 KB
    with pytest.raises(FlashError, match="filesystem is full"):
        flash(vb.port, "drafter", big, sources=sources, progress=False)
    assert mpremote(vb.port, "exec", "print('usable')").stdout == "usable\n"


def test_port_errors_are_one_line(virtual_board, tiny_node, tmp_path):
    sources, model = tiny_node
    with pytest.raises(FlashError, match="no such port"):
        flash(str(tmp_path / "ttyUSB9"), "drafter", model, sources=sources, progress=False)
    vb = virtual_board()
    with open_port(vb.port):  # someone else holds the port
        with pytest.raises(FlashError, match="busy"):
            flash(vb.port, "drafter", model, sources=sources, progress=False)
    master, slave = pty.openpty()  # a serial device that is not MicroPython: it never answers
    try:
        with pytest.raises(FlashError, match="no MicroPython REPL"):
            flash(os.ttyname(slave), "drafter", model, sources=sources, progress=False)
    finally:
        os.close(master)
        os.close(slave)


def test_board_checks_refuse_what_cannot_run_the_role():
    good = BoardInfo((1, 28, 0), 2822, "esp32", "ESP32", 100_000, 1 << 21, True)
    check_board(good, "drafter", 50_000, 80_000)
    old = BoardInfo((1, 19, 1), (10 << 10) | 6, "esp32", "ESP32", 100_000, 1 << 21, True)  # .mpy v6.0
    with pytest.raises(FlashError, match="1.23 or newer"):
        check_board(old, "drafter", 50_000, 80_000)
    with pytest.raises(FlashError, match="heap"):
        check_board(good, "verifier", 1_200_000, 1_300_000)
    no_viper = BoardInfo((1, 28, 0), 2822, "esp32", "ESP32", 100_000, 1 << 21, False)
    with pytest.raises(FlashError, match="viper"):
        check_board(no_viper, "drafter", 50_000, 80_000)


def test_auto_port_picks_the_one_esp32(monkeypatch):
    from serial.tools import list_ports_common

    def port(dev, vid):
        p = list_ports_common.ListPortInfo(dev)
        p.vid, p.pid = vid, 0x1234
        return p

    ports = [port("/dev/ttyS0", None), port("/dev/ttyUSB0", 0x10C4), port("/dev/ttyACM3", 0x2E8A)]
    monkeypatch.setattr("serial.tools.list_ports.comports", lambda: ports)
    assert resolve_port("auto") == "/dev/ttyUSB0"
    ports.append(port("/dev/ttyACM0", 0x303A))
    with pytest.raises(PortError, match="several"):
        resolve_port("auto")
    ports[:] = []
    with pytest.raises(PortError, match="no ESP32 board"):
        resolve_port("auto")


def test_cli_flash_reports_errors_in_one_line(capsys, tmp_path):
    model = tmp_path / "m.spm"
    model.write_bytes(b"x")
    assert cli.main(["flash", "--port", str(tmp_path / "nope"), "--role", "drafter", "--model", str(model)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such port" in err and "Traceback" not in err


@pytest.mark.parametrize("extra, message", [(["--role", "stage"], "needs it"),
                                            (["--role", "verifier", "--layers", "0:1"], "goes with --role stage"),
                                            (["--role", "stage", "--layers", "3"], "must be A:B"),
                                            (["--role", "stage", "--layers", "4:6"], "not a slice of the model's 5")])
def test_cli_flash_stage_layers_are_checked_in_one_line(capsys, tmp_path, monkeypatch, extra, message):
    """Checked before the board is touched (the port "exists" here, but no board is ever opened)."""
    from host.provision import flash as flash_mod

    monkeypatch.setattr(flash_mod.ports, "exists", lambda port: True)
    monkeypatch.setattr(flash_mod, "open_board", lambda port: pytest.fail("the board was opened"))
    model = ROOT / "models" / "target.spm"
    assert cli.main(["flash", "--port", str(tmp_path / "nope"), "--model", str(model), *extra]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err
