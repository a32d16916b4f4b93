"""A `specmesh emulate` board that goes away in the middle of a flash or a bench: one line that names the emulate
(not a real board's reset button or cable), no traceback (mpremote's close() raised EIO on the dead pty); a lost
port's reason in a few words, in those lines as in a run's link; a board reset mid-flash: the one line alone."""

import errno
import os
import signal
import subprocess
import sys
import time

import pytest
import serial

from specmesh.host.bus import ports
from specmesh.host.bus.links import LinkError, SerialLink
from specmesh.host.provision import flash as flash_module
from specmesh.host.provision.flash import FlashError, close, gone, port_gone


@pytest.fixture
def emulate():
    """A `specmesh emulate` process with one board: (the process, its board's port)."""
    proc = subprocess.Popen([sys.executable, "-m", "specmesh", "emulate", "--boards", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        lines = proc.said = [proc.stdout.readline() for _ in range(2)]
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
    assert " (Input/output error): " in message and "[Errno" not in message, message


def test_flash_on_an_emulate_board_whose_vm_resets_midway_is_told_to_flash_again_not_to_restart_the_emulate(
        emulate, monkeypatch):
    """The board's VM killed as a file is written (the emulate boots it again, as a board comes back from its reset
    button): the line said "its specmesh emulate was stopped ...: start specmesh emulate again (with the same --dir",
    which the running emulate's folder lock would refuse. Now: flash again, which completes the board."""
    proc, port = emulate
    write = flash_module._write

    def vms() -> set[str]:
        return set(subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split())

    def reset_then_write(*args, **kwargs):
        if args[1] == "/node.mpy.part":
            before = vms()
            os.kill(int(min(before)), signal.SIGKILL)
            deadline = time.monotonic() + 30
            while not vms() - before and time.monotonic() < deadline:
                time.sleep(0.05)  # the emulate booted the board again
        return write(*args, **kwargs)

    monkeypatch.setattr(flash_module, "_write", reset_then_write)
    with pytest.raises(FlashError) as e:
        flash_module.flash(port, "drafter", progress=False)
    message = str(e.value)
    assert message.startswith(port + ": lost the board while writing /node.mpy.part") and "\n" not in message
    assert "its VM was reset or stalled (its specmesh emulate still runs): run specmesh flash again" in message, message
    assert "start specmesh emulate again" not in message, message
    monkeypatch.setattr(flash_module, "_write", write)
    assert flash_module.flash(port, "drafter", progress=False).resumed == "drafter"


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


def test_a_lost_ports_reason_is_the_systems_few_words():
    """A lost board's line quoted pyserial's text whole: '([Errno 5] Input/output error)', 'write failed: [Errno 5]
    ...', or for a port hung up under its reader (a USB bridge unplugged) 'device reports readiness to read but
    returned no data (device disconnected or multiple access on port?)'; now the system's words, or 'the port hung
    up'. Here a pty whose other end closes."""
    master, slave = os.openpty()
    port = serial.Serial(os.ttyname(slave), timeout=1)
    os.close(slave)
    os.close(master)
    errors = []
    for use in (lambda: port.write(b"x"), lambda: port.read(1), lambda: port.in_waiting):
        with pytest.raises(OSError) as e:  # SerialException is an OSError
            use()
        errors.append(e.value)
    port.close()
    whys = [ports.lost_why(e) for e in errors]  # read(): EIO, or no data as a hung-up USB port gives
    assert whys[0] == whys[2] == "Input/output error" and whys[1] in whys[:1] + ["the port hung up"], errors
    hung_up = serial.SerialException("device reports readiness to read but returned no data (device disconnected or "
                                     "multiple access on port?)")  # as pyserial's read() words it
    assert ports.lost_why(hung_up) == "the port hung up"
    assert ports.lost_why(RuntimeError("could not enter raw repl\nmore")) == "could not enter raw repl"


def test_a_link_whose_port_closes_says_so_in_a_few_words():
    """A run's board lost: 'write failed: write failed: [Errno 5] Input/output error' (pyserial's prefix after the
    link's), 'read failed: device reports readiness to read but returned no data (device disconnected or multiple
    access on port?)'."""
    master, slave = os.openpty()
    link = SerialLink(os.ttyname(slave))
    try:
        os.close(slave)
        os.close(master)
        deadline = time.monotonic() + 10
        while link.error is None and time.monotonic() < deadline:
            time.sleep(0.01)
        port = link.port
        assert link.error in ("%s: read failed: %s" % (port, why) for why in ("Input/output error", "the port hung up"))
        with pytest.raises(LinkError) as e:
            link.send(b"x")
        assert str(e.value) == "%s: write failed: Input/output error" % port
    finally:
        link.close()


@pytest.mark.parametrize("lost", ["hung up", "closed"])
def test_a_call_waiting_on_a_silent_board_ends_when_its_port_is_lost(lost):
    """A request to a board that stopped answering, its port then hung up (the board's `specmesh emulate` ended, a USB
    cable pulled) or closed by the host (serve releasing the boards under a round it stopped): the call waited for its
    next retransmission (up to the bus's 30 s deadline) before it saw the link's error. Now it ends at once with it."""
    import threading

    from specmesh.host.bus.proxy import Bus, ProxyError
    from specmesh.shared import messages as m

    master, slave = os.openpty()
    link = SerialLink(os.ttyname(slave))
    bus = Bus(link, deadline=60.0, initial_rto=60.0)  # a silent board: no reply, no retransmission for 60 s
    said: list[str] = []

    def wait() -> None:
        with pytest.raises(ProxyError) as e:
            bus.request(1, m.HELLO)
        said.append(str(e.value))

    waiting = threading.Thread(target=wait)
    waiting.start()
    try:
        time.sleep(0.2)  # (the request sent, its call waiting)
        if lost == "hung up":
            os.close(slave)
            os.close(master)
        else:
            link.close()
        waiting.join(10)
        want = "read failed" if lost == "hung up" else "closed by the host"
        assert said and said[0].startswith(link.port + ": " + want), said
    finally:
        link.close()
        if lost == "closed":
            os.close(slave)
            os.close(master)
        waiting.join(60)


def test_a_board_reset_mid_flash_is_one_line_and_the_same_flash_completes_it(virtual_board, models, monkeypatch,
                                                                              capsys):
    """A board reset while a flash writes a file (its reset button; here its VM killed, which the supervisor boots
    again as a board comes back): the next command finds the friendly REPL, and mpremote printed the bytes it got
    (b'...paste mode; Ctrl-C to cancel...') on stdout above the flash's one line. Now the one line alone, and the
    same flash completes the board."""
    from specmesh.host import cli
    from specmesh.host.layout import DRAFTER_FILE

    vb = virtual_board()
    argv = ["flash", "--port", vb.port, "--role", "drafter", "--model", str(models / DRAFTER_FILE)]
    write = flash_module._write

    def reset_then_write(transport, dest, *args):
        if dest == "/node.mpy.part":
            pid = vb.pid
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while vb.pid in (pid, None) and time.monotonic() < deadline:
                time.sleep(0.05)  # the board's VM started again
        return write(transport, dest, *args)

    monkeypatch.setattr(flash_module, "_write", reset_then_write)
    assert cli.main(argv) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    assert "lost the board while writing /node.mpy.part" in err and "run specmesh flash again" in err, err
    monkeypatch.setattr(flash_module, "_write", write)
    assert cli.main(argv) == 0
    assert "left half-flashed (an interrupted flash as drafter): now complete" in capsys.readouterr().out


def test_emulate_says_one_board_as_one(emulate):
    """`specmesh emulate --boards 1` said "1 virtual ESP32 (classic, no PSRAM) board(s), ... stops them."."""
    proc, _ = emulate
    assert proc.said[0].startswith("1 virtual ESP32 (classic, no PSRAM) board, heap ")
    assert proc.said[0].endswith(". Ctrl-C (or SIGTERM) stops it.\n"), proc.said[0]


CHURN = """
import os, sys
below = [os.pipe() for _ in range(30)]
held = os.open(sys.argv[1], os.O_RDWR | os.O_NOCTTY)  # listed after the descriptors that come and go below it
for r, w in below:
    os.close(r)
    os.close(w)
print("up", flush=True)
while True:  # an emulate starting VMs: descriptors opened and closed all the time
    fds = [os.pipe() for _ in range(20)]
    for r, w in fds:
        os.close(r)
        os.close(w)
"""


def test_an_emulate_opening_and_closing_descriptors_is_still_told_an_emulate():
    """ports.emulated skipped a process whose descriptor closed between /proc's listing and its readlink: an emulate
    starting a VM was now and then taken for none, and its board timed as a real one (a flash failed after 3.5 s)."""
    master, slave = os.openpty()
    port = os.ttyname(slave)
    stand_in = subprocess.Popen([sys.executable, "-c", CHURN, port, "specmesh", "emulate"], stdout=subprocess.PIPE,
                                text=True)
    try:
        assert stand_in.stdout.readline() == "up\n"
        told = [ports.emulated(port) for _ in range(300)]
        assert all(told), "%d of %d asks said no emulate" % (told.count(False), len(told))
    finally:
        stand_in.kill()
        stand_in.wait()
        os.close(master)
        os.close(slave)
