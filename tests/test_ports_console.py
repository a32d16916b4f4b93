"""What mpremote users reach for: its port shortcuts (a0, u0, c0), FTDI adapters found by `--port auto`
(host/bus/ports.py), and `specmesh console PORT` (host/cli/console.py) on a virtual board."""

import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from specmesh.host import cli
from specmesh.host.bus import ports
from specmesh.host.layout import DRAFTER_FILE, MODELS

ROOT = Path(__file__).resolve().parent.parent


def test_mpremote_shortcuts_name_their_devices():
    assert ports.expand("a0") == "/dev/ttyACM0" and ports.expand("u1") == "/dev/ttyUSB1"
    assert ports.expand("c3") == "COM3" and ports.expand("u12") == "/dev/ttyUSB12"
    for other in ("auto", "/dev/ttyUSB0", "COM4", "a", "x0", "u0x", "socket://localhost:1"):
        assert ports.expand(other) == other
    assert ports.resolve_port("u0") == "/dev/ttyUSB0"


def test_a_shortcut_is_checked_as_its_device(models, capsys):
    rc = cli.main(["run", "--models", str(models), "--drafter", "a9", "--verifier", "cpu"])
    assert rc == 2 and "cannot open /dev/ttyACM9: no such port" in capsys.readouterr().err
    assert cli.main(["flash", "--port", "u9", "--role", "drafter"]) == 2  # the status run gives the same port
    assert "cannot open /dev/ttyUSB9: no such port" in capsys.readouterr().err


def test_auto_finds_a_board_behind_an_ftdi_adapter(monkeypatch):
    found = [SimpleNamespace(device="/dev/ttyUSB3", vid=0x0403, pid=0x6001, description="FT232R USB UART"),
             SimpleNamespace(device="/dev/ttyS0", vid=None, pid=None, description="n/a")]
    monkeypatch.setattr(ports.list_ports, "comports", lambda: found)
    assert ports.esp_ports() == [("/dev/ttyUSB3", "FTDI 0403:6001 FT232R USB UART")]
    assert ports.resolve_port("auto") == "/dev/ttyUSB3"
    monkeypatch.setattr(ports.list_ports, "comports", lambda: found[1:])
    with pytest.raises(ports.PortError, match="looked for Espressif, CP210x, CH340, FTDI USB serial ports"):
        ports.resolve_port("auto")


def test_console_auto_without_one_board_names_its_port_argument_not_a_flag(monkeypatch, capsys):
    """console takes its port as PORT: `auto` finding no board or several said "pass --port", which it has not."""
    board = SimpleNamespace(vid=0x303A, pid=0x1001, description="USB JTAG/serial debug unit")
    for found, line in (([], "no ESP32 board found (looked for Espressif, CP210x, CH340, FTDI USB serial ports); "
                             "pass PORT (specmesh console /dev/ttyUSB0)"),
                        ([SimpleNamespace(**vars(board), device="/dev/ttyACM%d" % i) for i in (0, 1)],
                         "several ESP32 boards found (/dev/ttyACM0, /dev/ttyACM1); pick one with PORT (specmesh "
                         "console /dev/ttyUSB0)")):
        monkeypatch.setattr(ports.list_ports, "comports", lambda found=found: found)
        assert cli.main(["console", "auto"]) == 2
        assert capsys.readouterr().err == "specmesh console: error: %s\n" % line
        with pytest.raises(ports.PortError, match="--port$"):  # bench takes it as --port
            ports.resolve_port("auto")
        assert cli.main(["flash", "--role", "drafter"]) == 2  # and flash, which make flash runs with PORT=
        assert capsys.readouterr().err.endswith(" --port (make flash: PORT=, e.g. make flash PORT=/dev/ttyUSB0)\n")


def test_console_on_a_port_url_without_a_descriptor_is_polled():
    """pyserial's rfc2217:// and loop:// have no fileno() to select() on: console said 'lost loop://: fileno'
    (status 1) at once; it polls them instead. loop:// echoes what is sent, as a board's REPL does."""
    out = subprocess.run([sys.executable, "-m", "specmesh.host.cli", "console", "loop://"], input=b"print(1)\r\n",
                         capture_output=True, timeout=60, cwd=ROOT)
    assert (out.returncode, out.stdout) == (0, b"print(1)\r\n"), out.stderr
    assert out.stderr == b"specmesh console: loop://; Ctrl-] leaves\n"


@pytest.mark.parametrize("signum, line", [(signal.SIGINT, "interrupted"), (signal.SIGTERM, "stopped by SIGTERM"),
                                          (signal.SIGHUP, "stopped by SIGHUP")])
def test_console_stopped_from_outside_says_so_with_the_signal_s_status(signum, line):
    """From a pipe (where Ctrl-C is the program's, not the board's), console ended on every stop with 130 and nothing
    said: a SIGTERM was 130, not 143, a SIGHUP not 129, and Ctrl-C had no 'interrupted' line, as every other
    command has (host/stops.py)."""
    proc = subprocess.Popen([sys.executable, "-m", "specmesh.host.cli", "console", "loop://"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        assert b"Ctrl-] leaves" in _read_until(proc.stderr.fileno(), b"leaves")
        time.sleep(0.5)  # in the pump, which the line comes just before
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == 128 + signum
        assert proc.stderr.read().strip() == b"specmesh console: %s" % line.encode()  # (after "leaves"'s newline)
    finally:
        if proc.poll() is None:
            proc.kill()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()


def _read_until(fd, marker: bytes, timeout: float = 20.0) -> bytes:
    seen = b""
    end = time.monotonic() + timeout
    while marker not in seen and time.monotonic() < end:
        if select.select([fd], [], [], 0.2)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_console_on_a_terminal_types_into_the_repl_and_ctrl_close_bracket_leaves(virtual_board):
    vb = virtual_board()
    master, slave = pty.openpty()  # the user's terminal
    proc = subprocess.Popen([sys.executable, "-m", "specmesh.host.cli", "console", vb.port], stdin=slave, stdout=slave,
                            stderr=subprocess.PIPE, cwd=ROOT)
    os.close(slave)
    try:
        assert b"Ctrl-] leaves" in _read_until(proc.stderr.fileno(), b"leaves")
        time.sleep(0.3)  # the console puts the terminal in raw mode after saying so
        os.write(master, b"\r")
        assert b">>> " in _read_until(master, b">>> ")
        os.write(master, b"print(6*7)\r")
        assert b"42" in _read_until(master, b"42")
        os.write(master, b"\x1d")
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    done = subprocess.run([sys.executable, "-m", "specmesh.host.cli", "console", vb.port], input=b"print(2**10)\r\n",
                          capture_output=True, cwd=ROOT, timeout=30)  # the port is free again; a pipe works too
    assert done.returncode == 0 and b"1024" in done.stdout


@pytest.mark.parametrize("hangup", [True, False])
def test_console_whose_terminal_is_closed_ends_without_a_traceback(hangup):
    """The terminal window closed under a console in raw mode: restoring the terminal failed (termios.error, EIO)
    and its traceback replaced the SIGHUP's line and status 129; without a SIGHUP (nohup, or not the controlling
    terminal: its stdin then ends) the same traceback came after the board's quiet second. Now: the SIGHUP's line and
    129, or the end of a console whose input ended, 0."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "specmesh.host.cli", "console", "loop://"], stdin=slave,
                            stdout=slave, stderr=subprocess.PIPE, cwd=ROOT, start_new_session=True)
    os.close(slave)
    try:
        assert b"Ctrl-] leaves" in _read_until(proc.stderr.fileno(), b"leaves")
        time.sleep(0.5)  # raw mode is set after that line
        os.close(master)  # the terminal is gone
        if hangup:
            time.sleep(0.3)
            proc.send_signal(signal.SIGHUP)
        assert proc.wait(timeout=30) == (129 if hangup else 0)
        assert proc.stderr.read().strip() == (b"specmesh console: stopped by SIGHUP" if hangup else b"")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stderr.close()


def test_console_that_loses_its_board_says_what_to_do(virtual_board):
    """The board goes away while watched (unplugged; here its VM and pty stop): one line, status 1, that says
    so and what to do, not the bare errno ('lost /dev/pts/3: [Errno 5] Input/output error')."""
    vb = virtual_board()
    proc = subprocess.Popen([sys.executable, "-m", "specmesh.host.cli", "console", vb.port], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        assert b"Ctrl-] leaves" in _read_until(proc.stderr.fileno(), b"leaves")
        vb.stop()
        assert proc.wait(timeout=30) == 1
        err = proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdin.close()
        proc.stdout.close()
        proc.stderr.close()
    err = err.strip()  # the newline after "leaves", and the one before the line (it may follow raw-mode output)
    assert err.startswith("specmesh console: error: lost %s (" % vb.port) and "\n" not in err and "[Errno" not in err, err
    assert err.endswith("): the board was unplugged, or its emulator stopped; when it is back, run specmesh console "
                        "again"), err


def test_console_on_a_board_that_failed_for_good_says_so(tmp_path):
    """A board of a specmesh emulate that cannot run again (its VM gone with its flash folder): its port stayed open
    with nothing answering, so a console on it showed nothing and never ended. Now the emulate closes the port, as a
    board unplugged: the console says in one line that it lost the board and what to do, status 1."""
    import shutil

    emulate = subprocess.Popen([sys.executable, "-m", "specmesh.host.cli", "emulate", "--boards", "1", "--dir",
                                str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, text=True)
    console = None
    try:
        emulate.stdout.readline()  # the summary line
        port = emulate.stdout.readline().split()[1]
        console = subprocess.Popen([sys.executable, "-m", "specmesh.host.cli", "console", port], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)  # stdin open: it watches
        assert b"Ctrl-] leaves" in _read_until(console.stderr.fileno(), b"leaves")
        (vm,) = subprocess.run(["pgrep", "-P", str(emulate.pid)], capture_output=True, text=True).stdout.split()
        shutil.rmtree(tmp_path / "board0")
        os.kill(int(vm), signal.SIGKILL)
        assert console.wait(timeout=30) == 1
        err = console.stderr.read().decode().strip()
    finally:
        emulate.kill()
        if console is not None and console.poll() is None:
            console.kill()
    assert err.startswith("specmesh console: error: lost %s (" % port) and "\n" not in err, err
    assert err.endswith("when it is back, run specmesh console again"), err


def test_console_whose_stdout_fails_blames_stdout_not_the_board():
    """A full stdout said 'lost loop:// ([Errno 28] No space left on device): the board was unplugged ...', and
    a reader that left (| head) 'lost ... Broken pipe': stdout's failures are said as every command says them
    (host/cli/streams.py): one line naming stdout, status 1; a reader gone, quietly, 141."""
    cmd = [sys.executable, "-m", "specmesh.host.cli", "console", "loop://"]
    with open("/dev/full", "wb") as full:
        done = subprocess.run(cmd, input=b"print(1)\r\n", stdout=full, stderr=subprocess.PIPE, cwd=ROOT, timeout=60)
    assert done.returncode == 1 and done.stderr.decode().splitlines()[1:] == [
        "specmesh console: error: cannot write to stdout: No space left on device"], done.stderr
    r, w = os.pipe()
    os.close(r)  # the reader left before the first byte
    try:
        done = subprocess.run(cmd, input=b"print(1)\r\n", stdout=w, stderr=subprocess.PIPE, cwd=ROOT, timeout=60)
    finally:
        os.close(w)
    assert done.returncode == 141 and done.stderr == b"specmesh console: loop://; Ctrl-] leaves\n", done.stderr


@pytest.mark.parametrize("given", [["/dev/ttyNOPE"], ["--port", "/dev/ttyNOPE"]])
def test_console_on_a_missing_port_is_one_line(capsys, given):
    """The port as PORT, or as --port as flash and bench take it (refused as an unknown flag before)."""
    assert cli.main(["console", *given]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specmesh console: error: cannot open /dev/ttyNOPE: no such port") and err.count("\n") == 1


@pytest.mark.parametrize("given, once", [([], ""), (["/dev/ttyUSB0", "--port", "/dev/ttyUSB1"], " once")])
def test_console_without_one_port_is_told_to_give_it_once(capsys, given, once):
    """Two ports are told 'once'; none was told the same, as if one had been given twice."""
    assert cli.main(["console", *given]) == 2
    assert capsys.readouterr().err == ("specmesh console: error: give the board's port%s: specmesh console PORT (or "
                                       "--port PORT)\n" % once)


def test_console_on_a_virtual_boards_port_that_is_gone_says_what_to_give(capsys):
    """A pseudo-terminal that is not there (a virtual board's, its emulate ended or the board failed) was only 'no such
    port (ESP32 USB ports here: none)': now the line also says what to give instead."""
    port = "/dev/pts/%d" % (max([int(p) for p in os.listdir("/dev/pts") if p.isdigit()] + [0]) + 1000)
    assert cli.main(["console", port]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specmesh console: error: cannot open %s: no such port (" % port) and err.count("\n") == 1
    assert err.endswith("; a virtual board's port closes when its specmesh emulate ends or the board fails: give one "
                        "that a running specmesh emulate lists\n"), err


# a user's fork, in a pytest worker that may hold other tests' threads (Python 3.12+ warns of those); the child
# only sleeps and leaves with os._exit
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded, use of fork:DeprecationWarning")
def test_a_lock_lent_to_a_forked_child_is_waited_out_not_called_busy():
    """A process that forks while it holds a port's exclusive lock lends it to the child until the child's exec
    (host/bus/ports.py LOCK_RETRY_S): the next exclusive open fails with EAGAIN though nobody holds the port. A
    child that keeps its copy 0.3 s: pyserial alone refuses the port, open_exclusive gets it once the copy is gone."""
    import serial

    master, slave = pty.openpty()
    port = os.ttyname(slave)
    try:
        held = serial.Serial(port, exclusive=True)
        child = os.fork()
        if child == 0:  # the copy of the locked descriptor, kept for a moment (as a child before its exec)
            time.sleep(0.3)
            os._exit(0)
        held.close()
        with pytest.raises(serial.SerialException, match="exclusively lock"):
            serial.Serial(port, exclusive=True)
        assert ports.why_unopenable(port, wait_s=0) == ("port %s is busy: another program has it open: end that, or "
                                                        "give another port" % port)  # the lock is this process's
        t0 = time.monotonic()
        with ports.open_exclusive(port) as ser:
            assert ser.is_open and time.monotonic() - t0 < ports.LOCK_RETRY_S
        os.waitpid(child, 0)
    finally:
        os.close(master)
        os.close(slave)


def test_a_port_busy_with_another_console_names_it_and_what_to_do(capsys):
    """A console left open in another terminal: a second console (or run, flash, bench) said "port ... is busy:
    another program has it open", not which one, nor what to do; now it names the command and its pid."""
    master, slave = pty.openpty()
    port = os.ttyname(slave)
    first = subprocess.Popen([sys.executable, "-m", "specmesh.host.cli", "console", port], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        assert b"Ctrl-] leaves" in _read_until(first.stderr.fileno(), b"leaves")
        assert cli.main(["console", port]) == 2
        assert capsys.readouterr().err == ("specmesh console: error: port %s is busy: `specmesh console %s` (pid %d) has "
                                           "it open: end that, or give another port\n" % (port, port, first.pid))
    finally:
        first.kill()
        first.wait()
        for stream in (first.stdin, first.stderr):
            stream.close()
        os.close(master)
        os.close(slave)


def test_a_port_held_by_another_program_names_it_in_one_short_line():
    """A holder that is not specmesh is named by its program; a long command line (a run's prompt) is cut short."""
    master, slave = pty.openpty()
    port = os.ttyname(slave)
    code = "import serial, sys, time; s = serial.Serial(sys.argv[1], exclusive=True); print(flush=True); time.sleep(60)"
    other = subprocess.Popen([sys.executable, "-c", code, port, "x" * 100], stdout=subprocess.PIPE)
    try:
        other.stdout.readline()  # the port is held
        command = "%s -c %s %s %s" % (os.path.basename(sys.executable), code, port, "x" * 100)
        assert ports.why_unopenable(port, wait_s=0) == ("port %s is busy: `%s...` (pid %d) has it open: end that, or "
                                                        "give another port" % (port, command[:57], other.pid))
    finally:
        other.kill()
        other.wait()
        other.stdout.close()
        os.close(master)
        os.close(slave)


@pytest.mark.parametrize("argv", [["console", "{url}"], ["flash", "--port", "{url}", "--role", "drafter"],
                                  ["bench", "--port", "{url}"]])
@pytest.mark.parametrize("url", ["loop://?x", "socket://localhost", "socket://localhost:99999", "rfc2217://host"])
def test_a_malformed_port_url_is_one_line_that_says_what_to_give(tmp_path, monkeypatch, capsys, argv, url):
    """pyserial's own errors for these are its message's format failing: `loop://?x` was a KeyError traceback,
    `socket://HOST` without its port "'<=' not supported between instances of 'int' and 'NoneType'"."""
    monkeypatch.chdir(tmp_path)  # bench's calibration.json, were it written
    assert cli.main([a.format(url=url) for a in argv]) == 2
    assert capsys.readouterr().err == ("specmesh %s: error: cannot open %s: not a port URL pyserial can parse: give "
                                       "socket://HOST:PORT, rfc2217://HOST:PORT, or a device\n" % (argv[0], url))


EMPTY_PORT = "the port is empty: give the board's serial port (e.g. /dev/ttyUSB0, or a0 as mpremote names it), or auto"


@pytest.mark.parametrize("argv, line", [
    (["console", ""], "specmesh console: error: " + EMPTY_PORT),
    # flash and bench tried to open a device named "" ('cannot open : No such file or directory')
    (["flash", "--port", " ", "--role", "drafter"], "specmesh flash: error: " + EMPTY_PORT),
    (["bench", "--port", ""], "specmesh bench: error: " + EMPTY_PORT),
    (["console", "/dev/null", "--baud", "0"], "specmesh console: error: --baud must be in 50..12000000, not 0"),
    (["keygen", "--key-file", ""], "specmesh keygen: error: --key-file is empty: give the new key's file, e.g. "
                                   "~/.specmesh/mesh.key"),
    # flash --key-file "$KEY", KEY unset, flashed with no key (the board left open, or keeping an old one), silently
    (["flash", "--port", "/dev/null", "--role", "drafter", "--key-file", ""],
     "specmesh flash: error: argument --key-file: is empty: give a path (an unset shell variable?)"),
    (["flash", "--port", "/dev/null", "--role", "drafter", "--model", ""],  # it said 'model file not found: .'
     "specmesh flash: error: argument --model: is empty: give a path (an unset shell variable?)"),
    # a folder as --model said 'model file not found: /tmp', of a folder that is there
    (["flash", "--port", "/dev/null", "--role", "drafter", "--model", "/"],
     "specmesh flash: error: --model /: a folder: name the model file in it"),
    # a device (or a FIFO) as --model said 'model file not found: /dev/zero', of a file that is there
    (["flash", "--port", "/dev/null", "--role", "drafter", "--model", "/dev/zero"],
     "specmesh flash: error: --model /dev/zero: not a regular file"),
])
def test_an_empty_port_or_file_or_a_baud_out_of_range_is_one_line_and_status_2(capsys, argv, line):
    try:
        status = cli.main(argv)
    except SystemExit as e:  # argparse's: its usage, then the line
        status = e.code
    assert status == 2 and capsys.readouterr().err.splitlines()[-1] == line


@pytest.mark.parametrize("name, bad", [("it's.spm", "'"), ("a\\n.spm", "\\"), ("a\nb.spm", "\n")])
def test_a_model_whose_name_the_boards_file_commands_cannot_quote_is_refused_before_the_board(tmp_path, capsys, name,
                                                                                               bad):
    """A model file named with a quote (it's.spm) was flashed by name, and mpremote's file commands put the name in
    '...' unescaped: the board's REPL got code it could not parse, and the flash (a run's virtual drafter's too) ended
    10 s later in "the board stopped answering ... unplugged, reset or froze". Refused in one line before the port."""
    shutil.copy(MODELS / DRAFTER_FILE, tmp_path / name)
    assert cli.main(["flash", "--port", "/dev/null", "--role", "drafter", "--model", str(tmp_path / name)]) == 2
    assert capsys.readouterr().err == (
        "specmesh flash: error: model file %s: its name holds %r, which a board's file commands (mpremote's) cannot "
        "quote: rename the file (letters, digits, spaces, -, _ and . are safe)\n" % (tmp_path / name, bad))


def test_a_port_the_system_refuses_says_why_without_the_errno_form():
    from specmesh.host.bus.ports import why_unopenable

    try:
        os.close(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY))
    except OSError:
        pass  # no controlling terminal: the system refuses /dev/tty (ENXIO), the case looked at
    else:
        pytest.skip("this process has a controlling terminal, so /dev/tty opens: run it without one, as CI does")
    why = why_unopenable("/dev/tty", wait_s=0)
    assert why is not None and why.startswith("cannot open /dev/tty: ") and "Errno" not in why, why


@pytest.mark.parametrize("argv", [["flash", "--port", "{dir}", "--role", "drafter"], ["bench", "--port", "{dir}"],
                                  ["console", "{dir}"]])
def test_a_folder_given_as_the_port_says_what_to_give_instead(tmp_path, capsys, argv):
    """A folder as the port said "cannot open DIR: Is a directory"; now that it is no serial port, and which are."""
    status = cli.main([a.format(dir=tmp_path) for a in argv])
    err = capsys.readouterr().err.splitlines()
    assert status == 2 and len(err) == 1, err
    assert err[0].split(": error: ")[1].startswith("cannot open %s: a folder, not a serial port (ESP32 USB ports here: "
                                                   % tmp_path)
