"""A `specmesh emulate` board that goes away in the middle of a flash or a bench: one line that names the emulate
(not a real board's reset button or cable), no traceback (mpremote's close() raised EIO on the dead pty)."""

import errno
import os
import signal
import subprocess
import sys

import pytest

from specmesh.host.bus import ports
from specmesh.host.provision import flash as flash_module
from specmesh.host.provision.flash import FlashError, close, gone, port_gone


@pytest.fixture
def emulate():
    """A `specmesh emulate` process with one board: (the process, its board's port)."""
    proc = subprocess.Popen([sys.executable, "-m", "specmesh", "emulate", "--boards", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        lines = [proc.stdout.readline() for _ in range(2)]
        assert lines[1].startswith("board0  /dev/"), lines
        yield proc, lines[1].split()[1]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_an_emulate_board_is_told_from_other_ptys(emulate):
    proc, port = emulate
    assert ports.emulated(port)
    master, slave = os.openpty()  # a pty this process holds, no emulate's
    try:
        assert not ports.emulated(os.ttyname(slave))
    finally:
        os.close(master)
        os.close(slave)
    assert not ports.emulated("/dev/null") and not ports.emulated("/dev/ttyUSB9")


def test_flash_on_a_board_whose_emulate_stops_midway_says_so(emulate, monkeypatch):
    proc, port = emulate
    write = flash_module._write

    def stop_then_write(*args, **kwargs):  # the emulate stopped as the first file is written
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        return write(*args, **kwargs)

    monkeypatch.setattr(flash_module, "_write", stop_then_write)
    with pytest.raises(FlashError) as e:
        flash_module.flash(port, "drafter", progress=False)
    message = str(e.value)
    assert message.startswith(port + ": lost the board") and "start specmesh emulate again" in message, message
    assert "reset button" not in message and "\n" not in message


def test_a_lost_port_is_closed_quietly():
    class Port:
        closed = False

        def close(self):
            self.closed = True

    class Transport:  # mpremote's close() clears RTS first: EIO on a pty whose other end is gone
        serial = Port()

        def close(self):
            raise OSError(errno.EIO, "Input/output error")

    transport = Transport()
    close(transport)
    assert transport.serial.closed
    assert port_gone(OSError(errno.EIO, "x")) and not port_gone(OSError(errno.ENOENT, "x"))
    assert "unplugged" in gone(False) and "specmesh emulate" not in gone(False)
    assert "specmesh emulate" in gone(True, "bench") and "specmesh bench again" in gone(True, "bench")
