"""Flashing virtual boards through the real path (mpy-cross, mpremote, hash check, reset), and its errors."""

import hashlib
import json
import os
import pty
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from emulator_util import appears, gated_vm, mpremote, open_port, read_until
from specmesh.host import cli
from specmesh.host.provision import flash as flash_module
from specmesh.host.bus.ports import PortError, resolve_port
from specmesh.host.layout import DRAFTER_FILE, TARGET_FILE
from specmesh.host.provision.flash import (ROOT, BoardInfo, DoesNotFit, FlashError, FlashRequestError, check_board,
                                             flash, node_sources)
from specmesh.tools.testmodels import random_model

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
    model = tmp_path / DRAFTER_FILE
    random_model(model)
    return [(src / "main.py", "/main.py"), (src / "greet.py", "/greet.py")], model


def test_flash_copies_verifies_and_starts_the_node(virtual_board, tiny_node):
    """On a board without ROMFS (a stock MicroPython build) the model goes to /models on the filesystem."""
    sources, model = tiny_node
    vb = virtual_board(romfs_bytes=0)
    report = flash(vb.port, "drafter", model, node_id=7, sources=sources, progress=False)
    assert report.board.arch == "x64" and report.board.virtual
    assert set(report.written) == {"/main.py", "/greet.mpy", "/models/drafter.spm", "/specmesh.json"}
    assert (vb.flash_dir / "greet.mpy").read_bytes()[:2] == b"M\x06"  # precompiled, .mpy v6
    assert (vb.flash_dir / "models" / DRAFTER_FILE).read_bytes() == model.read_bytes()
    config = json.loads((vb.flash_dir / "specmesh.json").read_text())
    assert config == {"role": "drafter", "node_id": 7, "model": "models/drafter.spm",
                      "board": "Generic ESP32 module with ESP32"}  # the class it stands for, for its HELLO
    with open_port(vb.port) as ser:  # the reset after flashing started main.py; reset again to watch it
        ser.write(b"\x03\x02")
        read_until(ser, b">>> ")
        ser.write(b"\x04")
        out = read_until(ser, b"greet.mpy\n")
        assert b"node up: drafter 7 sum=42" in out
    again = flash(vb.port, "drafter", model, node_id=7, sources=sources, progress=False)
    assert again.written == [] and len(again.unchanged) == 4


def test_boards_flashed_side_by_side_parse_their_replies_one_at_a_time(virtual_board, tiny_node):
    """mpremote parses a board's eval and listdir replies with ast.literal_eval, whose AST construction in CPython 3.11
    keeps one recursion count for every thread: two stages flashed side by side once failed one flash with
    "SystemError: AST constructor recursion depth mismatch" (in CI). Once a board is opened, mpremote's parses go
    through the flash's lock: one held here holds them back."""
    from mpremote import transport, transport_serial

    sources, model = tiny_node
    vb = virtual_board(romfs_bytes=0)
    flash(vb.port, "drafter", model, node_id=7, sources=sources, progress=False)
    for module in (transport, transport_serial):
        got: list[object] = []
        parse = threading.Thread(target=lambda: got.append(module.ast.literal_eval("[('main.py', 32768, 0)]")))
        with flash_module._PARSING:
            parse.start()
            parse.join(0.5)
            assert parse.is_alive() and got == [], module  # held back by the lock
        parse.join(10)
        assert got == [[("main.py", 32768, 0)]], module


def _board_sha256(port, path):
    return mpremote(port, "exec", "import hashlib; print(hashlib.sha256(open(%r, 'rb').read()).digest().hex())"
                    % path).stdout.strip()


HEAP_TOO_SMALL = dict(dim=48, n_layers=2, hidden=144, vocab=96)  # 70 KB of weights: 115 KB of heap with the
# node's reserve, more than a classic ESP32's 110.5 KB (host/boardclasses.py heap_need)


@pytest.mark.parametrize("romfs_port", ["", "esp32"], ids=["rom_ioctl-writes", "esp32-partition"])
def test_flash_puts_the_model_in_romfs_once(virtual_board, tiny_node, tmp_path, romfs_port):
    """A board with a ROMFS partition gets a model its heap cannot hold at /rom (a ROMFS image, checked by
    SHA-256 on the board), the config points there, nothing goes to /models, and a second flash leaves the
    image alone; on a partition served as the esp32 port serves it too (ports/esp32/esp32_partition.c
    mp_vfs_rom_ioctl: ops 1-2, an esp32.Partition block device, /rom mounted at the next boot)."""
    sources, _ = tiny_node
    model = tmp_path / "big" / DRAFTER_FILE
    model.parent.mkdir()
    random_model(model, seed=4, **HEAP_TOO_SMALL)
    vb = virtual_board(romfs_port=romfs_port)
    report = flash(vb.port, "drafter", model, sources=sources, progress=False)
    assert set(report.written) == {"/main.py", "/greet.mpy", "/rom/drafter.spm", "/specmesh.json"}
    assert json.loads((vb.flash_dir / "specmesh.json").read_text())["model"] == "/rom/drafter.spm"
    assert not (vb.flash_dir / "models").exists()
    assert vb.romfs_path.read_bytes()[:3] == b"\xd2\xcd\x31" and not vb.romfs_path.is_relative_to(vb.flash_dir)
    assert _board_sha256(vb.port, "/rom/drafter.spm") == hashlib.sha256(model.read_bytes()).hexdigest()
    written_at = vb.romfs_path.stat().st_mtime_ns
    again = flash(vb.port, "drafter", model, sources=sources, progress=False)
    assert again.written == [] and "/rom/drafter.spm" in again.unchanged
    assert vb.romfs_path.stat().st_mtime_ns == written_at  # the partition was not even erased
    other = tmp_path / "other" / DRAFTER_FILE
    other.parent.mkdir()
    random_model(other, seed=5, **HEAP_TOO_SMALL)
    # the config is written again too: it said "flashing" while the partition was rewritten
    assert flash(vb.port, "drafter", other, sources=sources, progress=False).written == ["/rom/drafter.spm",
                                                                                         "/specmesh.json"]
    assert _board_sha256(vb.port, "/rom/drafter.spm") == hashlib.sha256(other.read_bytes()).hexdigest()


def test_a_model_the_heap_holds_stays_off_romfs(virtual_board, tiny_node):
    """Read from the heap, a model costs no flash read per pass: a board with a ROMFS partition keeps a
    small one on its filesystem, and the node loads it into its heap."""
    sources, model = tiny_node
    vb = virtual_board()
    report = flash(vb.port, "drafter", model, sources=sources, progress=False)
    assert "/models/drafter.spm" in report.written
    assert json.loads((vb.flash_dir / "specmesh.json").read_text())["model"] == "models/drafter.spm"
    assert set(vb.romfs_path.read_bytes()) == {0xFF}  # the partition is still erased


def test_cli_flash_no_romfs_keeps_the_model_on_the_filesystem(virtual_board, tiny_node, capsys):
    _, model = tiny_node
    vb = virtual_board()
    assert cli.main(["flash", "--port", vb.port, "--role", "drafter", "--model", str(model), "--no-romfs",
                     "--no-reset"]) == 0, capsys.readouterr().err
    assert json.loads((vb.flash_dir / "specmesh.json").read_text())["model"] == "models/drafter.spm"
    assert (vb.flash_dir / "models" / DRAFTER_FILE).read_bytes() == model.read_bytes()
    assert set(vb.romfs_path.read_bytes()) == {0xFF}  # the partition is still erased


def test_cli_flash_checks_the_model_file_once(virtual_board, tiny_node, capsys, monkeypatch):
    """`specmesh flash` checked its request (the model file read and CRC-checked, a drafter's n-gram table loaded)
    before the port, flash() all of it again, and the ROMFS choice the model file once more; now once."""
    _, model = tiny_node
    vb = virtual_board()
    checked = []
    check = flash_module.check_model_file
    monkeypatch.setattr(flash_module, "check_model_file", lambda path: checked.append(path) or check(path))
    assert cli.main(["flash", "--port", vb.port, "--role", "drafter", "--model", str(model),
                     "--no-reset"]) == 0, capsys.readouterr().err
    assert checked == [model]


def test_a_board_with_psram_keeps_the_model_in_psram(virtual_board, tiny_node):
    """An ESP32-S3 with PSRAM and a ROMFS partition: its heap holds the model, read faster than mapped flash."""
    sources, model = tiny_node
    vb = virtual_board("esp32s3", romfs_bytes=128 * 1024)
    report = flash(vb.port, "verifier", model, sources=sources, progress=False, reset=False)
    assert "/models/drafter.spm" in report.written
    assert json.loads((vb.flash_dir / "specmesh.json").read_text())["model"] == "models/drafter.spm"
    assert set(vb.romfs_path.read_bytes()) == {0xFF}


def test_romfs_too_small_for_the_model(virtual_board, tiny_node, tmp_path):
    """A partition too small for the image: the model goes to the filesystem when it fits the heap, and is
    refused in one line saying what to do when it fits neither."""
    sources, model = tiny_node
    vb = virtual_board(romfs_bytes=4096)
    report = flash(vb.port, "drafter", model, sources=sources, progress=False)
    assert "/models/drafter.spm" in report.written and "/rom/drafter.spm" not in report.written
    big = tmp_path / "big" / DRAFTER_FILE
    big.parent.mkdir()
    random_model(big, dim=64, n_layers=4, hidden=172, vocab=512)  # 263 KB: more than a classic ESP32's heap
    with pytest.raises(FlashError, match="ROMFS partition holds 4 KiB: flash a MicroPython build with a bigger"):
        flash(vb.port, "drafter", big, sources=sources, progress=False)


def test_flashed_firmware_node_answers(virtual_board, tmp_path):
    """The real node on a classic ESP32 reads its model from ROMFS and answers HELLO as the drafter."""
    import contextlib

    from specmesh.host.provision.cluster import _open, discover
    from specmesh.shared import messages as m
    from specmesh.shared.codec import BROADCAST

    vb = virtual_board()
    model = ROOT / "models" / DRAFTER_FILE
    report = flash(vb.port, "drafter", model, node_id=1, progress=False)
    assert {dest for _, dest in node_sources()} <= {d[:-4] + ".py" if d.endswith(".mpy") else d
                                                    for d in report.written}
    assert "/rom/drafter.spm" in report.written
    assert report.board.arch == "x64" and "/native/x64.mpy" in report.written  # the module for its arch only
    assert not [d for d in report.written if d.startswith("/native/") and d != "/native/x64.mpy"]
    def hello() -> tuple:
        with contextlib.ExitStack() as stack:
            bus = _open(vb.port, stack)
            assert discover(bus).src == 1
            return m.unpack_hello(bus.request(BROADCAST, m.HELLO).payload)

    said = hello()
    assert (said[2], said[3]) == (m.ROLE_DRAFTER, "/rom/drafter.spm")
    assert said[0] == flash_module.firmware_id()  # the id of the files flashed, which the host compares with its own
    # the board it stands for, as a classic ESP32 names itself (the stats' machine), not the VM's build
    assert said[1] == "Generic ESP32 module with ESP32"
    assert said[9] == "native"  # the flashed module passed its self-test
    (vb.flash_dir / "native" / ".selftest").write_bytes(b"")  # as a module that stopped the board leaves it
    (vb.flash_dir / "native" / "xtensawin.mpy").write_bytes(b"M")  # another arch's module
    again = flash(vb.port, "drafter", model, node_id=1, progress=False)
    # both removed: the module self-tested again (its mark is there only while it runs, as the node starts: asked
    # once the node answers)
    assert again.written == [] and hello()[9] == "native"
    assert sorted(p.name for p in (vb.flash_dir / "native").iterdir()) == ["x64.mpy"]


def test_a_filesystem_smaller_than_the_flash_is_too_small_not_too_full_and_the_board_stays_usable(
        virtual_board, tiny_node, tmp_path):
    """A filesystem that could not hold the flash even empty: removing files cannot make room (it was told to), so
    the line says it is too small, its whole size as the probe read it, and what does help."""
    sources, _ = tiny_node
    vb = virtual_board("esp32s3", flash_bytes=64 * 1024)  # heap enough for the model, flash not
    big = tmp_path / DRAFTER_FILE
    random_model(big, dim=64, n_layers=4, hidden=172, vocab=512)  # 263 KB
    with pytest.raises(DoesNotFit) as e:
        flash(vb.port, "drafter", big, sources=sources, progress=False)
    said = re.fullmatch(r"the board's filesystem is too small for this flash: ([\d,]+) bytes to write, ([\d,]+) in "
                        r"all: flash a smaller model \(--model\), or a MicroPython build whose partition table gives "
                        r"the filesystem \(its vfs partition\) more room", str(e.value))
    assert said, str(e.value)
    need, size = (int(v.replace(",", "")) for v in said.groups())
    assert need > big.stat().st_size and size == 64 * 1024
    assert mpremote(vb.port, "exec", "print('usable')").stdout == "usable\n"


FILL = ("n = 0\ntry:\n while True:\n  with open('/fill%d' % n, 'wb') as f:\n   f.write(bytes(4096))\n  n += 1\n"
        "except OSError:\n pass\nimport os\nprint(os.statvfs('/')[3])\n")  # fills the board's filesystem up


def test_a_board_lost_as_its_config_is_read_is_lost_not_full(virtual_board, tiny_node, monkeypatch):
    """The port gone as the flash read the board's config and listed its files: read as a board with neither, the
    flash was priced as a whole one onto a full filesystem: 'the board's filesystem is too full for this flash ...
    remove files from it', and a port that came back meanwhile had its config (link, peers) replaced."""
    sources, model = tiny_node
    vb = virtual_board(romfs_bytes=0, flash_bytes=128 * 1024)
    flash(vb.port, "drafter", model, sources=sources, progress=False)
    room = "import os\nwith open('/fill', 'wb') as f:\n for _ in range(os.statvfs('/')[3] - 2): f.write(bytes(4096))\n"
    assert mpremote(vb.port, "exec", room).returncode == 0  # 8 KiB left: room for none of the files, if all changed
    read_config = flash_module.read_board_config

    def lost_then_read(transport):
        vb.stop()  # its pty closed: the port is gone, as a board unplugged
        return read_config(transport)

    monkeypatch.setattr(flash_module, "read_board_config", lost_then_read)
    with pytest.raises(FlashError) as e:
        flash(vb.port, "drafter", model, sources=sources, progress=False)
    assert str(e.value).startswith(vb.port + ": lost the board ("), str(e.value)


def test_a_truly_full_filesystem_is_one_line_with_the_bytes_and_what_to_do(virtual_board, tiny_node, monkeypatch,
                                                                           capsys):
    """0 bytes free read as "not known" (the probe's sentinel), so the check passed and mkdir /models failed with
    an OSError traceback; now the check says it, and a filesystem found full only while writing (the check's
    estimate short of littlefs's own blocks) is the same line."""
    sources, model = tiny_node
    vb = virtual_board(flash_bytes=64 * 1024)
    assert mpremote(vb.port, "exec", FILL).stdout == "0\n"
    monkeypatch.setattr(flash_module, "node_sources", lambda root=ROOT: sources)
    rc = cli.main(["flash", "--port", vb.port, "--role", "drafter", "--model", str(model), "--no-romfs"])
    need = re.search(r"full for this flash: ([\d,]+) bytes to write, 0 free: ", capsys.readouterr().err)
    assert rc == 1 and need and int(need[1].replace(",", "")) > model.stat().st_size
    monkeypatch.setattr(flash_module, "check_board", lambda *a: None)
    with pytest.raises(FlashError) as e:
        flash(vb.port, "drafter", model, sources=sources, progress=False, use_romfs=False)
    assert str(e.value) == ("the board's filesystem is too full for this flash: no room left to make the folder "
                            "/models: remove files from it (`mpremote connect {0} fs ls` lists them, `mpremote connect "
                            "{0} fs rm FILE` removes one) or flash a smaller model (--model)".format(vb.port))
    assert mpremote(vb.port, "exec", "print('usable')").stdout == "usable\n"


def test_port_errors_are_one_line(virtual_board, tiny_node, tmp_path):
    sources, model = tiny_node
    with pytest.raises(FlashError, match="no such port"):
        flash(str(tmp_path / "ttyUSB9"), "drafter", model, sources=sources, progress=False)
    vb = virtual_board()
    with open_port(vb.port):  # someone else holds the port
        with pytest.raises(FlashError, match="busy"):
            flash(vb.port, "drafter", model, sources=sources, progress=False)
    master, slave = pty.openpty()  # a board that never answers (frozen: its VM stopped with SIGSTOP, unpowered)
    try:
        with pytest.raises(FlashError) as e:
            flash(os.ttyname(slave), "drafter", model, sources=sources, progress=False)
        assert str(e.value).startswith("%s: the board is silent: nothing came back within " % os.ttyname(slave))
        assert "key" not in str(e.value)  # it was "... or it runs a node with a deployment key ... --key-file"
    finally:
        os.close(master)
        os.close(slave)


def test_a_port_no_board_answers_on_is_a_usage_error_for_flash_and_bench_as_for_run(tmp_path, capsys):
    """A silent port (or one where no MicroPython answers) given to flash or bench exited 1, a failure while working,
    where run says the same port with 2: nothing was written, the port given cannot be used."""
    master, slave = pty.openpty()
    port = os.ttyname(slave)
    try:
        for argv in (["flash", "--port", port, "--role", "drafter"],
                     ["bench", "--port", port, "--out", str(tmp_path / "c.json")]):
            assert cli.main(argv) == 2
            err = capsys.readouterr().err
            assert err.startswith("specmesh %s: error: %s: the board is silent: " % (argv[0], port)), err
    finally:
        os.close(master)
        os.close(slave)


def test_a_keyed_node_flashed_without_its_key_is_told_so(virtual_board, tiny_node, tmp_path):
    """A node with a deployment key takes no Ctrl-C, so no REPL answers; unlike a silent board, it refuses a HELLO
    unsigned, and the flash says that: the key is the cause here, and named only here."""
    from specmesh.host.provision.keys import load_key, new_key_file

    sources, model = tiny_node
    new_key_file(tmp_path / "k")
    vb = virtual_board()
    flash(vb.port, "drafter", model, key=load_key(str(tmp_path / "k")), progress=False)
    with pytest.raises(FlashError, match="key mismatch: the board signs its frames: it holds a deployment key"):
        flash(vb.port, "drafter", model, sources=sources, progress=False)


def _fake_board(replies: dict[bytes, bytes], last: bytes = b""):
    """A pty whose far end answers each byte in `replies` with its reply and ignores every other byte, and answers
    nothing more once it has answered `last`: a board whose REPL goes silent at a chosen step. (port, close)."""
    master, slave = pty.openpty()
    done = threading.Event()

    def serve():
        while not done.is_set():
            try:
                data = os.read(master, 1)
            except OSError:
                return
            if data in replies:
                os.write(master, replies[data])
                if data == last:
                    return

    threading.Thread(target=serve, daemon=True).start()

    def close():
        done.set()
        os.close(slave)
        os.close(master)

    return os.ttyname(slave), close


# the raw REPL's banner on Ctrl-A; on Ctrl-D (its soft reset) the reboot and the banner again; on Ctrl-E (raw paste)
# "yes" and then nothing: the window-size header never comes (its \x01 goes unanswered)
BANNER = b"raw REPL; CTRL-B to exit\r\n>"
SILENT_IN_RAW_PASTE = {b"\x01": BANNER, b"\x04": b"OK\r\nMPY: soft reboot\r\n" + BANNER, b"\x05": b"R\x01"}


def test_a_board_gone_silent_mid_command_fails_the_flash_in_bounded_time(tiny_node, monkeypatch):
    """mpremote's port reads without a timeout: a board that stopped answering mid-command (here: the raw-paste
    header) held the flash for ever. Each read now waits READ_S at most, and the flash fails in one line."""
    sources, model = tiny_node
    monkeypatch.setattr(flash_module, "READ_S", 0.3, raising=False)
    port, close = _fake_board(SILENT_IN_RAW_PASTE, last=b"\x05")
    outcome = []

    def attempt():
        try:
            flash(port, "drafter", model, sources=sources, progress=False)
        except Exception as e:  # noqa: BLE001 - the test looks at it
            outcome.append(e)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout=20)
    try:
        assert not worker.is_alive(), "the flash still waits on a silent board"
        assert len(outcome) == 1 and isinstance(outcome[0], FlashError), outcome
        assert "stopped answering" in str(outcome[0])
    finally:
        close()


def test_a_board_slow_to_come_back_from_its_soft_reset_is_not_blamed_on_a_key():
    """A board whose REPL answered but that did not come back from the soft reset in time (a virtual board on a busy
    host) is said to be slow, not to hold a deployment key."""
    port, close = _fake_board({b"\x01": BANNER, b"\x04": b"OK\r\nMPY: soft reboot\r\n"})
    try:
        with pytest.raises(FlashError, match="did not come back from a soft reset within 0.5 s") as e:
            flash_module.open_board(port, timeout=0.5)
        assert "key" not in str(e.value)
    finally:
        close()


def _gated_vms(tmp_path, monkeypatch, then: str = 'exec %s "$@"') -> tuple[Path, Path]:
    """From now on this process's board VMs are gated_vm's (tests/emulator_util.py): returns (started, open)."""
    from specmesh.host.emulator import board as board_mod

    vm, started, gate = gated_vm(tmp_path, then)
    monkeypatch.setattr(board_mod, "micropython_binary", lambda: str(vm))
    return started, gate


def test_a_virtual_board_slow_to_boot_is_waited_for_and_a_real_ones_silence_said_as_soon(virtual_board, tmp_path,
                                                                                          monkeypatch):
    """A virtual board's reboot starts a fresh VM, which a loaded host can hold back past any clock: a flash that met
    one rebooting called it silent, or said it "did not come back from a soft reset within 10 s" (mpremote's own limit
    on a port without a byte). open_board now waits for a virtual board's VM to say it is up, the one it met booting
    and the one its soft reset starts, each held here well past open_board's timeout; its clock times the REPL of a
    VM that is up. A port with no board behind it is still said silent after REPL_S, as before."""
    vb = virtual_board()
    (vb.flash_dir / "main.py").write_text("import sys\nwhile True:\n    sys.stdin.buffer.read(1)\n")  # as a node reads
    started, gate = _gated_vms(tmp_path, monkeypatch)
    with open_port(vb.port) as ser:
        ser.write(b"\x04")  # a soft reset at the REPL: the board reboots, into main.py
        read_until(ser, b"soft reboot\r\n")
    appears(started / "0")  # its next VM is started, and held
    opened: list = []
    timeout = 3.0  # short of the 10 s that timed a reboot before, well past an up VM's answer on a loaded host
    worker = threading.Thread(target=lambda: opened.append(flash_module.open_board(vb.port, timeout=timeout)),
                              daemon=True)
    worker.start()  # while the board reboots
    try:
        for n in range(2):  # the VM it met booting, then the one its soft reset starts
            appears(started / str(n))
            time.sleep(timeout + 0.5)  # past open_board's timeout: it is still waiting, not failed
            assert worker.is_alive() and not opened
            (gate / str(n)).touch()
        worker.join(timeout=60)
        assert opened, "open_board failed (its error is in the thread's traceback above)"
        assert opened[0].exec("print(6 * 7)").strip() == b"42"
    finally:
        (gate / "0").touch()
        (gate / "1").touch()
        worker.join(timeout=60)
        if opened:
            flash_module.close(opened[0])
    master, slave = pty.openpty()  # a real board that never answers
    try:
        with pytest.raises(FlashError) as e:
            flash_module.open_board(os.ttyname(slave))
        assert str(e.value).startswith("%s: the board is silent: nothing came back within %g s"
                                       % (os.ttyname(slave), flash_module.REPL_S + 1.5))
    finally:
        os.close(master)
        os.close(slave)


def test_a_virtual_board_whose_vm_never_comes_up_or_stalls_fails_the_flash_in_one_line(virtual_board, tmp_path,
                                                                                       monkeypatch):
    """What no wait mends still ends a flash in one line: a VM that hangs before it is up, after VM_START_S (shortened
    here), a VM that exits as it starts at once (the supervisor gives the board up after five such exits), and a VM
    that is up but stalled as soon as a real board's silence (REPL_S, then a HELLO's 1.5 s), no longer 11.5 s."""
    from specmesh.host.emulator import board as board_mod

    hung, dead, stalled = virtual_board(name="hung"), virtual_board(name="dead"), virtual_board(name="stalled")
    pid = stalled.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(FlashError) as e:
            flash_module.open_board(stalled.port)
        assert str(e.value).startswith("%s: the board is silent: nothing came back within %g s"
                                       % (stalled.port, flash_module.REPL_S + 1.5)), e.value
    finally:
        os.kill(pid, signal.SIGCONT)
    monkeypatch.setattr(board_mod, "VM_START_S", 1.0)
    (tmp_path / "gate-hung").mkdir()
    _gated_vms(tmp_path / "gate-hung", monkeypatch)  # never opened
    with pytest.raises(FlashError) as e:
        flash_module.open_board(hung.port)
    assert str(e.value) == ("%s: the virtual board did not come back from a soft reset: its VM did not come up within "
                            "1 s" % hung.port)
    monkeypatch.setattr(board_mod, "VM_START_S", 600.0)
    (tmp_path / "gate-dead").mkdir()
    _gated_vms(tmp_path / "gate-dead", monkeypatch, then="exit 1 # %s")
    for n in range(5):  # its VMs' starts let through: each exits at once
        (tmp_path / "gate-dead" / "open" / str(n)).touch()
    with pytest.raises(FlashError) as e:
        flash_module.open_board(dead.port)
    assert str(e.value) == ("%s: the virtual board did not come back from a soft reset: the VM keeps exiting at start "
                            "(exit code 1)" % dead.port)


def test_board_checks_refuse_what_cannot_run_the_role():
    good = BoardInfo((1, 28, 0), 2822, "esp32", "ESP32", 100_000, 1 << 21, True)
    check_board(good, "drafter", 50_000, 80_000)
    old = BoardInfo((1, 19, 1), (10 << 10) | 6, "esp32", "ESP32", 100_000, 1 << 21, True)  # .mpy v6.0
    with pytest.raises(FlashError, match="1.23 or newer"):
        check_board(old, "drafter", 50_000, 80_000)
    with pytest.raises(FlashError, match="heap; .* build with ROMFS keeps it in flash"):
        check_board(good, "verifier", 1_200_000, 1_300_000)
    with pytest.raises(FlashError) as e:  # a stage's slice is in the heap whatever the build: it said no more
        check_board(good, "stage", 144_000, 300_000)
    assert str(e.value) == ("the stage model needs 140 KiB of heap; this board has 97 KiB free: give it fewer of the "
                            "target's layers (--layers A:B), or a board with PSRAM (an ESP32-S3)")
    rom = BoardInfo((1, 28, 0), 2822, "esp32", "ESP32", 100_000, 1 << 21, True, 256 * 1024)
    with pytest.raises(FlashError) as e:  # `flash --no-romfs` on a board whose partition holds the model: no way on
        check_board(rom, "drafter", 115_000, 10_000, romfs_would_hold=True)
    assert str(e.value).endswith("this board has 97 KiB free: drop --no-romfs, and its ROMFS partition keeps the model "
                                 "in flash"), e.value
    check_board(rom, "drafter", 115_000, 10_000, rom_image=115_100)  # the weights stay in flash: no heap check
    with pytest.raises(FlashError) as e:  # a classic ESP32 asked to verify: the S3 is named (it was not)
        check_board(rom, "verifier", 300_000, 10_000, rom_image=300_000)
    assert str(e.value) == ("the verifier model's ROMFS image is 292 KiB; the board's ROMFS partition holds 256 KiB: "
                            "flash a MicroPython build with a bigger romfs partition, use a board with PSRAM (an "
                            "ESP32-S3: its heap holds the model), or give a smaller model")
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
    # a usage error, as `specmesh run` reports the same port: status 2
    assert cli.main(["flash", "--port", str(tmp_path / "nope"), "--role", "verifier"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such port" in err and "Traceback" not in err


@pytest.mark.parametrize("port", ["nope", "auto"])
@pytest.mark.parametrize("extra, message", [(["--role", "stage", "--layers", "4:6"], "--layers 4:6 is not a slice"),
                                            (["--role", "stage", "--layers", "3"], "--layers must be A:B"),
                                            (["--role", "verifier", "--layers", "0:1"], "--layers A:B goes with"),
                                            (["--role", "verifier", "--model", "{tmp}/m.spm"], "is truncated")])
def test_cli_flash_tells_a_bad_flag_before_a_wrong_port(capsys, tmp_path, monkeypatch, port, extra, message):
    """A bad --layers (or model) given with a wrong port, or --port auto where no board is plugged in, was told only
    "no such port" / "no ESP32 board found": fixing that, the user met the flag's error on the next try. Every check
    that needs no board now comes first."""
    monkeypatch.setattr("serial.tools.list_ports.comports", lambda: [])
    (tmp_path / "m.spm").write_bytes(b"x")
    model = ["--model", str(ROOT / "models" / TARGET_FILE)] if "--model" not in extra else []
    argv = ["flash", "--port", str(tmp_path / port) if port != "auto" else port, *model,
            *(a.format(tmp=tmp_path) for a in extra)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize("extra, message", [(["--role", "stage"], "needs it"),
                                            (["--role", "verifier", "--layers", "0:1"], "goes with --role stage"),
                                            (["--role", "stage", "--layers", "3"], "must be A:B"),
                                            (["--role", "stage", "--layers", "4:6"], "not a slice of the model's 5")])
def test_cli_flash_stage_layers_are_checked_in_one_line(capsys, tmp_path, monkeypatch, extra, message):
    """Checked before the board is touched (the port "exists" here, but no board is ever opened)."""
    from specmesh.host.provision import flash as flash_mod

    monkeypatch.setattr(flash_mod.ports, "exists", lambda port: True)
    monkeypatch.setattr(flash_mod, "open_board", lambda port: pytest.fail("the board was opened"))
    model = ROOT / "models" / TARGET_FILE
    assert cli.main(["flash", "--port", str(tmp_path / "nope"), "--model", str(model), *extra]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


class _Partition(bytearray):
    """What the esp32 port's `vfs.rom_ioctl(2, 0)` hands out: an esp32.Partition, a block device (ioctl,
    writeblocks) whose buffer is the memory-mapped flash; rom_ioctl ops 3-5 are not served there."""

    def ioctl(self, op, arg):
        if op == 6:  # erase a block
            self[arg * 4096:(arg + 1) * 4096] = b"\xff" * 4096
        return {4: len(self) // 4096, 5: 4096}.get(op, 0)

    def writeblocks(self, block, buf, off=0):
        start = block * 4096 + off
        self[start:start + len(buf)] = buf


def test_romfs_deploy_to_a_block_device_partition(monkeypatch, tiny_node):
    """The board code of host/provision/romfs.py, run by CPython against an esp32-style partition."""
    import types

    from specmesh.host.provision import romfs

    part = _Partition(b"\xff" * (64 * 1024))
    monkeypatch.setitem(sys.modules, "vfs", types.SimpleNamespace(
        rom_ioctl=lambda op, *args: {1: 1, 2: part}.get(op, -22), umount=lambda path: None))

    class Board:  # the mpremote transport's exec and eval, run here
        def __init__(self):
            self.ns = {}

        def exec(self, code):
            exec(code, self.ns)

        def eval(self, expr):
            return eval(expr, self.ns)

    board = Board()
    board.exec(romfs.PROBE)
    assert board.ns["rom"] == 64 * 1024
    image = romfs.image(tiny_node[1])
    done = []
    romfs.write(board, image, done.append)
    assert bytes(part[:len(image)]) == image and done[-1] == len(image)
    assert romfs.digest(board, len(image)) == hashlib.sha256(image).digest()


def test_a_file_whose_hash_is_wrong_on_the_board_is_sent_again(virtual_board, tiny_node, monkeypatch):
    """A copy damaged on the way (here: its first send of greet.mpy loses a byte) is sent again, and the board
    ends with the right file under its name and no temporary file."""
    from specmesh.host.provision import flash as flashing

    sources, model = tiny_node
    vb = virtual_board(romfs_bytes=0)
    write = flashing._write
    damaged = []

    def lossy(transport, dest, data, chunk, bar):
        if dest.startswith("/greet.mpy") and not damaged:
            damaged.append(dest)
            data = data[:-1]
        write(transport, dest, data, chunk, bar)

    monkeypatch.setattr(flashing, "_write", lossy)
    report = flash(vb.port, "drafter", model, sources=sources, progress=False)
    assert damaged == ["/greet.mpy.part"] and report.resent == ["/greet.mpy"]
    assert "sent again after a wrong hash: /greet.mpy" in flashing.summary(report, 1.0)
    local = flashing.build("x64", vb.flash_dir.parent / "local", iter(sources))["/greet.mpy"]
    assert (vb.flash_dir / "greet.mpy").read_bytes() == local.read_bytes()
    assert not list(vb.flash_dir.rglob("*.part"))


def test_a_drafter_table_goes_to_the_filesystem_beside_any_model(virtual_board, tiny_node):
    """The n-gram table beside the drafter's model file is copied and named in the config (shared/ngram.py);
    a verifier's flash names none."""
    from specmesh.host.layout import ngram_table_name
    from specmesh.tools.ngram import table_bytes

    sources, model = tiny_node
    table = model.with_name(ngram_table_name(model.name))
    table.write_bytes(table_bytes({(1, 2, 3, 4): 5}))
    vb = virtual_board(romfs_bytes=0)
    report = flash(vb.port, "drafter", model, node_id=7, sources=sources, progress=False)
    assert "/models/drafter.ngt" in report.written
    assert (vb.flash_dir / "models" / "drafter.ngt").read_bytes() == table.read_bytes()
    config = json.loads((vb.flash_dir / "specmesh.json").read_text())
    assert config["table"] == "models/drafter.ngt"
    flash(vb.port, "verifier", model, node_id=2, sources=sources, progress=False)
    assert "table" not in json.loads((vb.flash_dir / "specmesh.json").read_text())


def test_a_drafter_with_a_broken_table_is_refused_before_the_board_is_touched(virtual_board, tiny_node):
    """The table is read on the host first, as the model is: its path on this machine and what to do, and the
    board's flash is left as it was."""
    from specmesh.host.layout import ngram_table_name

    sources, model = tiny_node
    table = model.with_name(ngram_table_name(model.name))
    table.write_bytes(b"SMNG" + bytes(16))
    vb = virtual_board(romfs_bytes=0)
    before = sorted(p.relative_to(vb.flash_dir) for p in vb.flash_dir.rglob("*"))
    try:
        with pytest.raises(FlashRequestError, match=r"^n-gram table %s: .*: copy it again, rebuild it \(python -m "
                                                     r"specmesh\.tools\.ngram\) or delete it" % re.escape(str(table))):
            flash(vb.port, "drafter", model, node_id=7, sources=sources, progress=False)
    finally:
        table.unlink()
    assert sorted(p.relative_to(vb.flash_dir) for p in vb.flash_dir.rglob("*")) == before


def test_a_virtual_board_whose_class_cannot_hold_the_model_names_the_flags_to_choose_instead(tmp_path):
    """No MicroPython build can be flashed onto a virtual board: the advice is a class or a split, not a build."""
    import subprocess

    target = ROOT / "models" / TARGET_FILE  # 269 KiB as a classic ESP32 drafter board's ROMFS image: 128 KiB
    done = subprocess.run([sys.executable, "-m", "specmesh.host.cli", "run", "-n", "2", "--verifier", "cpu",
                           "--draft-model", str(target)], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=dict(os.environ, SPECMESH_VBOARDS=str(tmp_path / "vboards")))
    assert done.returncode == 2 and done.stderr.splitlines()[-1] == (
        "specmesh run: error: virtual drafter board (esp32): the drafter model's ROMFS image is 269 KiB; the board's "
        "ROMFS partition holds 128 KiB: give a class with PSRAM (--drafter virtual:esp32s3), or a smaller drafter "
        "(--draft-model)")


def test_models_switched_back_and_forth_never_fill_the_filesystem(virtual_board, tiny_node, tmp_path):
    """Each flash removes the models and tables in /models its config does not name, and counts what it writes
    against what they and the copies it replaces free: a board flashed with two drafters in turn once ran out of
    room for the one it already held."""
    from specmesh.host.layout import ngram_table_name
    from specmesh.tools.ngram import table_bytes

    sources, small = tiny_node
    other = tmp_path / "other" / "wide.spm"
    other.parent.mkdir()
    random_model(other, dim=32, n_layers=2, hidden=64, vocab=512, seed=3)
    for model in (small, other):  # tables of about 60 KB each, their tokens in the small model's vocabulary of 96
        model.with_name(ngram_table_name(model.name)).write_bytes(table_bytes(
            {(1, 2, 3, t % 500): t % 90 + 1 for t in range(5000)}))
    vb = virtual_board(romfs_bytes=0, flash_bytes=320 * 1024)
    for model in (small, other, small, other, small):
        flash(vb.port, "drafter", model, sources=sources, progress=False, use_romfs=False)
        held = mpremote(vb.port, "exec", "import os; print(sorted(os.listdir('/models')))").stdout
        assert held == "%s\n" % sorted([model.name, ngram_table_name(model.name)])


def test_a_model_the_heap_cannot_hold_is_refused_on_a_flashed_board_as_on_a_fresh_one(virtual_board):
    """A classic ESP32's heap holds its class's drafter but not the 64-wide one (off ROMFS): a fresh board refused it,
    but once flashed the virtual board's heap had room for the node's modules too (counted as frozen), which the probe
    read as free (101 KiB, then 204 KiB): the flash went through and the node refused the model at load ("does not fit
    in 116096 bytes of free heap"). Now refused both times."""
    vb = virtual_board()
    drafter = ROOT / "models" / DRAFTER_FILE
    refusals = []
    for _ in range(2):
        with pytest.raises(DoesNotFit) as e:
            flash(vb.port, "drafter", drafter, progress=False, use_romfs=False)
        refusals.append(str(e.value))
        flash(vb.port, "drafter", progress=False)  # its class's drafter, which it holds: the board is flashed
    assert all(r.startswith("the drafter model needs 107 KiB of heap; this board has ") for r in refusals), refusals
    assert all(r.endswith(": drop --no-romfs, and its ROMFS partition keeps the model in flash") for r in refusals)


def test_the_flash_summary_counts_one_file_as_one():
    """A flash that sent only the model said "flashed 1 files"; the count is now said as English says it."""
    info = BoardInfo((1, 28, 0), 0, "esp32", "Generic ESP32 module with ESP32", 100_000, 1_000_000, True)
    one = flash_module.FlashReport("p", info, written=["/model.spm"], unchanged=["/a.mpy", "/b.mpy"], bytes_written=9)
    assert flash_module.summary(one, 1.0).startswith("flashed 1 file (9.00B) in 1.0 s, 2 unchanged,")
    none = flash_module.FlashReport("p", info, unchanged=["/a.mpy"])
    assert flash_module.summary(none, 1.0).startswith("up to date, not flashed (1 file checked in 1.0 s)")
    two = flash_module.FlashReport("p", info, written=["/a.mpy", "/b.mpy"])
    assert flash_module.summary(two, 1.0).startswith("flashed 2 files (")



def test_a_flash_returns_once_the_virtual_board_runs_its_new_firmware(virtual_board, models, tmp_path, monkeypatch,
                                                                      capsys):
    """A flash's last key (its Ctrl-D, which starts the node) reached a virtual board after the flash returned, so what
    came next (a flash, a run's discovery) could meet the old VM still up at its REPL, its reset still to come. A flash
    now returns once the VM of the boot that reset starts is up, held here at its gate (it waits on), and one that does
    not come up within VM_START_S (shortened) ends the flash in one line."""
    from specmesh.host.emulator import board as board_mod

    vb = virtual_board()
    argv = ["flash", "--port", vb.port, "--role", "drafter", "--model", str(models / DRAFTER_FILE)]
    started, gate = _gated_vms(tmp_path, monkeypatch)  # VM 0: the flash's soft reset; 1: its reset into the node
    (gate / "0").touch()
    outcome: list = []
    worker = threading.Thread(target=lambda: outcome.append(cli.main(argv)), daemon=True)
    worker.start()
    try:
        appears(started / "1")
        assert worker.is_alive() and not outcome, "the flash returned before the board rebooted into the node"
    finally:
        (gate / "1").touch()
        worker.join(timeout=120)
    assert outcome == [0], capsys.readouterr().err
    boots = vb.boots
    assert vb.wait_ready(after=boots - 1, limit=0) is None  # that boot's VM is up
    monkeypatch.setattr(board_mod, "VM_START_S", 1.0)
    (gate / "2").touch()  # the next flash's soft reset; its reset into the node (VM 3) never comes up
    capsys.readouterr()
    assert cli.main(argv) == 1
    out, err = capsys.readouterr()
    assert (out, err) == ("", f"specmesh flash: error: {vb.port}: the virtual board did not come back from its reset "
                              "into the node: its VM did not come up within 1 s\n"), (out, err)


def test_flashes_and_hellos_back_to_back_all_go_through(virtual_board, models, tmp_path):
    """Each flash followed at once by a HELLO or by another flash, keyed (whose node takes no Ctrl-C: the next flash
    ends it with a signed RESET, which must reach the node, not the old VM's REPL) and not: all go through."""
    from specmesh.host.bus.links import SerialLink
    from specmesh.host.bus.proxy import Bus, HostAuth
    from specmesh.host.provision.keys import load_key, new_key_file
    from specmesh.shared import messages as m
    from specmesh.shared.codec import BROADCAST

    new_key_file(tmp_path / "k")
    key = load_key(str(tmp_path / "k"))
    vb = virtual_board()
    model = models / DRAFTER_FILE
    held = False  # whether the board holds the key: a keyed board is flashed with its key only
    for i in range(20):
        keyed = i % 4 < 2  # keyed twice, then twice without: each flash follows one of either kind
        flash(vb.port, "drafter", model, key=key if keyed or held else None, clear_key=not keyed, progress=False)
        held = keyed
        if i % 2:
            auth = HostAuth(key) if keyed else None
            link = SerialLink(vb.port, auth=auth)
            try:
                reply = Bus(link, deadline=30.0, auth=auth).request(BROADCAST, m.HELLO, deadline=30.0)
            finally:
                link.close()
            assert reply.src == flash_module.NODE_ID["drafter"], (i, reply)


def test_a_no_reset_flash_returns_with_the_board_at_its_prompt(virtual_board, tiny_node):
    """A --no-reset flash leaves the board at its friendly REPL, whose banner and prompt its last key (Ctrl-B, out of
    the raw REPL) made the board print after the flash returned: what came next met them in flight (a Ctrl-C then a
    Ctrl-D read that prompt as the Ctrl-C's). The flash now returns once that prompt was read, so a line written at
    once gets its echo and answer, and nothing before them, each of 20 times."""
    sources, model = tiny_node
    vb = virtual_board()
    for i in range(20):
        flash(vb.port, "drafter", model, sources=sources, progress=False, reset=False)
        with open_port(vb.port) as ser:
            ser.write(b"print(1+1)\r")
            assert read_until(ser, b">>> ") == b"print(1+1)\r\n2\n>>> ", i  # the unix port prints "\n"


def test_a_no_reset_flash_whose_board_never_shows_its_prompt_fails_in_one_line(virtual_board, tiny_node, monkeypatch,
                                                                             capsys):
    """A board that froze as a --no-reset flash ended (its VM stopped as the flash's Ctrl-B is sent): the flash waits
    REPL_S (shortened then) for the prompt, not for ever, and says in one line that its files are in place and how to
    start the board, not to flash it again."""
    from mpremote.transport_serial import SerialTransport

    _, model = tiny_node
    vb = virtual_board()
    stopped: list[int] = []
    exit_raw_repl = SerialTransport.exit_raw_repl

    def freezing(transport) -> None:
        if not stopped:
            stopped.append(vb.pid)
            os.kill(stopped[0], signal.SIGSTOP)
            monkeypatch.setattr(flash_module, "REPL_S", 0.5)
        exit_raw_repl(transport)

    monkeypatch.setattr(SerialTransport, "exit_raw_repl", freezing)
    try:
        assert cli.main(["flash", "--port", vb.port, "--role", "drafter", "--model", str(model), "--no-reset"]) == 1
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    assert err.startswith(f"specmesh flash: error: {vb.port}: the flash is written and verified, but the board did not "
                          "show its REPL's prompt within 0.5 s after it: the flash is complete: "), err
    assert "flash again" not in err, err  # the flash is whole: a second one is not what mends it
    assert json.loads((vb.flash_dir / "specmesh.json").read_text())["role"] == "drafter"
